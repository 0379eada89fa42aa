"""``init_from``: a workload that starts from another tenant's final checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from joynexus.api import WorkloadState
from joynexus.errors import PermissionDeniedError, SpecError
from joynexus.master.limits import MasterLimits
from joynexus.spec.workload import WorkloadSpec, load_specs, parse_spec
from joynexus.workflows.compile import compile_workloads
from tests.fakes.plane import FakeServer, rl_spec


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeServer]:
    srv = FakeServer(tmp_path / "run", limits=MasterLimits(cross_tenant_eval=True))
    yield srv
    srv.close()


def _from(tenant: str, source: str, **kw: Any) -> WorkloadSpec:
    data = rl_spec(tenant, **kw).model_dump(mode="json", by_alias=True)
    return parse_spec({**data, "init_from": source})


def test_the_second_workload_waits_for_the_first_and_starts_from_its_checkpoint(
    server: FakeServer,
) -> None:
    first = server.run(server.master.lifecycle.submit(rl_spec("sft", target=3), "sft"))
    second = server.run(server.master.lifecycle.submit(_from("rl", "sft", target=1), "rl"))
    done = server.run(server.master.lifecycle.wait(second.workload_id, timeout_s=10))
    source = server.master.reporter.status("sft", first.workload_id)
    assert done.state is WorkloadState.COMPLETED, done
    assert source.state is WorkloadState.COMPLETED  # it had ended before rl started
    (record,) = server.master.reporter.metrics("rl", second.workload_id, kind="init_from").records
    assert record["source"] == "sft"
    assert record["checkpoint"].endswith(f"sft/step_{source.policy_version}")
    started = server.plane.training.config("rl").init_checkpoint
    assert started is not None and str(started) == record["checkpoint"]


def test_compile_checks_what_init_from_names(tmp_path: Path) -> None:
    sft = rl_spec("sft")
    with pytest.raises(SpecError, match="neither a trainable tenant"):
        compile_workloads([_from("rl", "nobody")])
    other = rl_spec("sft").model_dump(mode="json", by_alias=True)
    other["env"]["image_size"] = 16
    with pytest.raises(SpecError, match="another interface"):
        compile_workloads([parse_spec(other), _from("rl", "sft")])
    compile_workloads([sft, _from("rl", "sft")])
    with pytest.raises(SpecError, match="itself"):
        _from("sft", "sft")


def test_a_server_refuses_init_from_unless_it_allows_cross_tenant_reads(tmp_path: Path) -> None:
    srv = FakeServer(tmp_path / "run")
    try:
        with pytest.raises(PermissionDeniedError, match="init_from"):
            srv.master.compiler.compile(_from("rl", "sft"), "rl")
    finally:
        srv.close()


def test_a_relative_checkpoint_path_is_resolved_against_the_spec_file(tmp_path: Path) -> None:
    data = rl_spec("rl").model_dump(mode="json", by_alias=True)
    (tmp_path / "w.yaml").write_text(yaml.safe_dump({**data, "init_from": "ckpt/step_3"}))
    (spec,) = load_specs(tmp_path / "w.yaml")
    assert spec.init_from == str(tmp_path / "ckpt/step_3")
