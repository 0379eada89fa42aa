from __future__ import annotations

from pathlib import Path

import pytest

from joynexus.control.job import TaskType
from joynexus.errors import DatasetError, SpecError
from joynexus.spec.workload import load_specs
from joynexus.workflows.compile import compile_workloads
from tests.workflows.helpers import record_reach2d_demos, rl_spec, spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "workloads"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_example_loads_and_compiles(path: Path) -> None:
    specs = load_specs(path)
    tenants = {s.tenant for s in specs}
    earlier = [
        s.init_from
        for s in specs
        if s.init_from and s.init_from not in tenants and not Path(s.init_from).exists()
    ]
    if earlier:
        # It starts from another example's checkpoint (its comment says which to run
        # first); on a fresh clone, before that run, it stops with one line naming it.
        with pytest.raises(SpecError, match=r"init_from .* nor a checkpoint directory"):
            compile_workloads(specs)
        return
    compiled = compile_workloads(specs)
    assert compiled.workloads
    for w in compiled.workloads:
        # Shipped examples run anywhere: a tiny model built offline, never a download
        # (tiny:smolvla by the real lerobot in the LeRobot venv that make install builds).
        tiny = ("tiny:qwen2_5_vl", "tiny:pi0", "tiny:smolvla")
        assert w.spec.base_model.id in tiny, w.spec.base_model.id
        if w.config is not None:
            assert w.admission is not None and w.admission.completion_target
            assert w.config.schema_ == w.schema


def test_examples_cover_the_required_workloads() -> None:
    names = {p.name for p in EXAMPLES.glob("*.yaml")}
    assert {
        "sft-metaworld.yaml",
        "rl-pusht.yaml",
        "rl-metaworld.yaml",
        "rl-reach2d.yaml",
        "eval-pusht.yaml",
        "mixed.yaml",
    } <= names
    tasks = [
        w.spec.task.value for w in compile_workloads(load_specs(EXAMPLES / "mixed.yaml")).workloads
    ]
    assert sorted(tasks) == ["eval", "rl", "rl", "sft"]


def test_policies_and_global_limits(tmp_path: Path) -> None:
    a = rl_spec("a", "tiny:qwen2_5_vl", tmp_path, target=3, max_in_flight=2)
    compiled = compile_workloads([a])
    w = compiled.workloads[0]
    assert w.task_type is TaskType.RL
    assert w.admission is not None
    assert (w.admission.max_in_flight, w.admission.completion_target) == (2, 3)
    (limit,) = compiled.global_limits
    assert (limit.max_active, limit.max_active_per_tenant) == (3, 1)
    assert w.schema.name == "reach2d" and w.schema.cameras["top"].height == 32


def test_unknown_env_kind_lists_known_kinds(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"known kinds: .*reach2d"):
        compile_workloads([rl_spec("a", "tiny:qwen2_5_vl", tmp_path, kind="nope")])


def _sft(tmp_path: Path, path: Path, **extra: object) -> object:
    return spec(
        {
            "tenant": "s",
            "task": "sft",
            "base_model": {"id": "tiny:qwen2_5_vl"},
            "dataset": {"path": str(path)},
            "scheduling": {"completion_target": 2},
            "output_dir": str(tmp_path),
            **extra,
        }
    )


def test_missing_dataset_without_recordable_env_fails(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        compile_workloads([_sft(tmp_path, tmp_path / "none")])  # type: ignore[list-item]


def test_missing_dataset_with_recordable_env_is_flagged(tmp_path: Path) -> None:
    s = _sft(tmp_path, tmp_path / "later", env={"kind": "pusht", "image_size": 32})
    (w,) = compile_workloads([s]).workloads  # type: ignore[list-item]
    assert w.needs_recording


def test_dataset_schema_derived_and_mismatch_rejected(tmp_path: Path) -> None:
    root = record_reach2d_demos(tmp_path / "demos", episodes=2, image_size=16)
    (w,) = compile_workloads([_sft(tmp_path, root)]).workloads  # type: ignore[list-item]
    assert (w.schema.state_dim, w.schema.action_dim) == (4, 2)
    assert w.schema.cameras["top"].height == 16
    with pytest.raises(DatasetError, match="does not match"):
        compile_workloads([_sft(tmp_path, root, schema="pusht")])  # type: ignore[list-item]


def test_eval_targets_must_be_trainable_tenants_of_the_run(tmp_path: Path) -> None:
    ev = spec(
        {
            "tenant": "ev",
            "task": "eval",
            "base_model": {"id": "tiny:qwen2_5_vl"},
            "env": {"kind": "reach2d", "image_size": 32},
            "evaluation": {"targets": ["ghost"]},
        }
    )
    with pytest.raises(SpecError, match="trainable tenants: \\['a'\\]"):
        compile_workloads([rl_spec("a", "tiny:qwen2_5_vl", tmp_path), ev])


def test_one_base_model_per_run(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="one resident base model"):
        compile_workloads(
            [rl_spec("a", "tiny:qwen2_5_vl", tmp_path), rl_spec("b", "tiny:smolvlm", tmp_path)]
        )


def test_a_tenant_evaluating_itself_without_a_policy_is_told_what_gives_it_one() -> None:
    """Regression: the message was "is not a trainable tenant of this run; trainable
    tenants: []"."""
    ev = spec(
        {
            "tenant": "ev",
            "task": "eval",
            "base_model": {"id": "tiny:qwen2_5_vl"},
            "env": {"kind": "reach2d", "image_size": 32},
            "evaluation": {"targets": ["ev"]},
        }
    )
    with pytest.raises(SpecError) as caught:
        compile_workloads([ev], served={})
    assert "tenant 'ev' has no policy to evaluate yet" in str(caught.value)
    assert "an rl, sft or custom workload of its own gives it one" in str(caught.value)
