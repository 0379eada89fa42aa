"""The Master Service's tenant creator and lifecycle, without HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from joynexus.api import WorkloadState
from joynexus.errors import ConflictError, NotFoundError, PermissionDeniedError, SpecError
from joynexus.master.limits import MasterLimits
from joynexus.spec.workload import parse_spec
from joynexus.workflows.compile import compile_workloads
from tests.server.livesrv import (  # fixtures: reach_demos, tiny_model
    make_live,
    reach_custom,
    reach_demos,  # noqa: F401
    reach_rl,
    tenant_dataset_root,
    tiny_model,  # noqa: F401
)


def test_custom_workloads_run_only_on_a_server(tiny_model: str) -> None:  # noqa: F811
    spec = parse_spec(reach_custom("alice", tiny_model))
    with pytest.raises(SpecError, match="joynexus serve"):
        compile_workloads([spec])
    compiled = compile_workloads([spec], allow_custom=True).workloads[0]
    assert compiled.config is not None and compiled.task_type is None
    with pytest.raises(Exception, match="schema"):
        parse_spec({"tenant": "a", "task": "custom", "base_model": {"id": "x"}})


def test_tenant_creator_validates_and_signs_deterministically(
    tmp_path: Path,
    tiny_model: str,  # noqa: F811
    reach_demos: Path,  # noqa: F811
) -> None:
    roots = [tenant_dataset_root(tmp_path / "datasets", reach_demos, "alice")]
    srv = make_live(tmp_path, tiny_model, limits=MasterLimits(dataset_roots=roots))
    master = srv.master
    a = master.compiler.compile(parse_spec(reach_rl("alice", tiny_model)), "alice")
    b = master.compiler.compile(parse_spec(reach_custom("alice", tiny_model)), "alice")
    sig = master.base.signature_for(a.schema)
    assert sig == master.base.signature_for(b.schema)  # same interface, same signature
    assert a.spec.output_dir == tmp_path / "outputs"  # the server decides where outputs go
    assert a.admission is not None and a.admission.completion_target == 2

    with pytest.raises(PermissionDeniedError):
        master.compiler.compile(parse_spec(reach_rl("bob", tiny_model)), "alice")
    ev = parse_spec(
        {
            "tenant": "alice",
            "task": "eval",
            "base_model": {"id": tiny_model},
            "env": {"kind": "reach2d", "image_size": 32},
            "evaluation": {"targets": ["bob"]},
        }
    )
    with pytest.raises(PermissionDeniedError, match="other tenants"):
        master.compiler.compile(ev, "alice")
    own = ev.model_copy(
        update={"evaluation": ev.evaluation.model_copy(update={"targets": ["alice"]})}
    )  # type: ignore[union-attr]
    with pytest.raises(SpecError, match="no policy to evaluate"):
        master.compiler.compile(own, "alice")  # no policy yet


def test_lifecycle_sft_then_eval_of_the_same_policy(
    tmp_path: Path,
    tiny_model: str,  # noqa: F811
    reach_demos: Path,  # noqa: F811
) -> None:
    from tests.server.livesrv import reach_sft

    async def main() -> None:
        roots = [tenant_dataset_root(tmp_path / "datasets", reach_demos, "alice")]
        srv = make_live(tmp_path, tiny_model, limits=MasterLimits(dataset_roots=roots))
        master = srv.master
        async with srv.app.router.lifespan_context(srv.app):
            st = await master.lifecycle.submit(
                parse_spec(reach_sft("alice", tiny_model, Path(reach_demos.name))), "alice"
            )
            with pytest.raises(ConflictError):
                await master.lifecycle.submit(
                    parse_spec(reach_custom("alice", tiny_model)), "alice"
                )
            while not master.reporter.status("alice", st.workload_id).state.is_terminal:
                await asyncio.sleep(0.05)
            done = master.reporter.status("alice", st.workload_id)
            assert done.state is WorkloadState.COMPLETED and done.jobs_completed >= 2
            ev = parse_spec(
                {
                    "tenant": "alice",
                    "task": "eval",
                    "base_model": {"id": tiny_model},
                    "env": {"kind": "reach2d", "image_size": 32, "max_episode_steps": 4},
                    "evaluation": {"targets": ["alice"], "episodes": 1, "interval_s": 0.01},
                }
            )
            est = await master.lifecycle.submit(ev, "alice")
            while not master.reporter.status("alice", est.workload_id).state.is_terminal:
                await asyncio.sleep(0.05)
            final = master.reporter.status("alice", est.workload_id)
            assert final.state is WorkloadState.COMPLETED, final
            assert final.eval_runs_completed == final.eval_runs_target == 1
            runs = master.reporter.metrics("alice", est.workload_id, kind="eval").records
            assert runs[0]["version"] == done.policy_version  # it read the trained policy
            with pytest.raises(NotFoundError):  # like an unknown id: no oracle
                master.reporter.status("bob", est.workload_id)

    asyncio.run(main())


def test_the_master_repeats_none_of_its_model_primitives() -> None:
    """One predict surface: callers use ``master.primitives``; no Master delegate."""
    from joynexus.master.primitives import ModelPrimitives
    from joynexus.master.service import MasterService

    calls = {n for n in vars(ModelPrimitives) if not n.startswith("_")}
    assert {"predict", "train_batch", "rollout", "require_slot"} <= calls
    assert calls.isdisjoint(vars(MasterService)), calls & set(vars(MasterService))


def test_the_master_keeps_no_delegate_methods() -> None:
    """Each call is written once, on the part that answers it (``master.lifecycle``,
    ``master.reporter``, ...): the Master's own public methods are its lifetime only."""
    from joynexus.master.service import MasterService

    public = {n for n in vars(MasterService) if not n.startswith("_")}
    assert public == {"start", "aclose"}, public
