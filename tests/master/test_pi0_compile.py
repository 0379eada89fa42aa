"""The tenant creator checks a pi0_expert against the resident π0 checkpoint (HTTP 422)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from joynexus.errors import SpecError
from joynexus.models.schema import PUSHT
from joynexus.spec.workload import parse_spec
from tests.server.livesrv import make_live, tiny_model  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def tiny_pi0(tmp_path_factory: pytest.TempPathFactory) -> str:
    from joynexus.models.tiny import make_tiny

    return str(make_tiny("pi0", tmp_path_factory.mktemp("pi0") / "pi0"))


def _custom(model: str, **schema: Any) -> dict[str, Any]:
    return {
        "tenant": "alice",
        "task": "custom",
        "base_model": {"id": model},
        "schema": PUSHT.model_copy(update={"name": "arm", **schema}).model_dump(),
        "algorithm": {"name": "reinforce"},
        "action_module": {"type": "pi0_expert"},
    }


def test_a_schema_the_checkpoint_cannot_serve_is_a_spec_error(
    tmp_path: Path, tiny_pi0: str
) -> None:
    master = make_live(tmp_path, tiny_pi0).master
    assert (
        master.compiler.compile(
            parse_spec(_custom(tiny_pi0, action_dim=7)), "alice"
        ).schema.action_dim
        == 7
    )
    with pytest.raises(SpecError, match="max_action_dim of 32") as wide:
        master.compiler.compile(parse_spec(_custom(tiny_pi0, action_dim=33)), "alice")
    assert wide.value.http_status == 422
    assert wide.value.details["fields"] == ["schema.action_dim"]
    with pytest.raises(SpecError, match="chunk_size of 16") as long:
        master.compiler.compile(parse_spec(_custom(tiny_pi0, action_chunk=17)), "alice")
    assert long.value.details["fields"] == ["schema.action_chunk"]


def test_a_pi0_expert_on_another_base_is_a_spec_error(
    tmp_path: Path,
    tiny_model: str,  # noqa: F811
) -> None:
    master = make_live(tmp_path, tiny_model).master
    with pytest.raises(SpecError, match="needs a π0 base model"):
        master.compiler.compile(parse_spec(_custom(tiny_model)), "alice")
