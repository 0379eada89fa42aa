"""Inside ``joynexus.models`` dependencies point one way too: from what leaves a process
down to the data types (docs/ARCHITECTURE.md, "models/ by concern").

checkpoints → execution → tenant → policies → backbone → archs → lora → canon → data
types. ``tiny`` imports nothing of joynexus (a side venv loads it from its file), so it
sits with the data types.
"""

from __future__ import annotations

from tests.test_layering import Edge, all_edges, upward_edges

#: Concerns of ``joynexus.models``, top first; a module may import lower tiers only.
MODEL_TIERS: tuple[tuple[str, ...], ...] = (
    ("joynexus.models.checkpoints",),
    ("joynexus.models.execution",),
    ("joynexus.models.tenant",),
    ("joynexus.models.policies",),
    ("joynexus.models.backbone",),
    ("joynexus.models.archs",),
    ("joynexus.models.lora",),
    ("joynexus.models.canon",),
    ("joynexus.models.batch", "joynexus.models.availability"),
    (
        "joynexus.models.schema",
        "joynexus.models.normalization",
        "joynexus.models.types",
        "joynexus.models.tiny",
    ),
    ("joynexus.models",),
)


def _inside(edges: list[Edge]) -> list[Edge]:
    def models(name: str) -> bool:
        return name == "joynexus.models" or name.startswith("joynexus.models.")

    return [e for e in edges if models(e.source) and models(e.target)]


def test_the_model_tiers_reject_an_arrow_back_up() -> None:
    edge = Edge("joynexus.models.policies.tenant_export", "joynexus.models.checkpoints.payload", 1)
    assert upward_edges([edge], MODEL_TIERS, allowed={})


def test_every_import_inside_models_points_down() -> None:
    assert upward_edges(_inside(all_edges()), MODEL_TIERS, allowed={}) == []
