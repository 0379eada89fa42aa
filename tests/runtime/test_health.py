"""Health Manager: heartbeats, probes, error reports, partial restart, budget, escalation;
and an inference role killed during a mixed workload (an in-process Master on an engine
pool)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joynexus.control.job import JobState
from joynexus.errors import ServiceUnavailableError
from joynexus.master.run import LocalRun, run_workloads
from joynexus.models.backbone import ResidentBaseModel
from joynexus.runtime.health import HealthManager
from joynexus.runtime.hosting import EnginePoolPlacement
from joynexus.runtime.scaling import EnginePool
from joynexus.utils.clock import FakeClock
from joynexus.workflows.summary import TenantProgress
from tests.models.conftest import tiny_backbone, tiny_model_dir  # noqa: F401
from tests.runtime.test_scaling import Factory, obs, tenant
from tests.workflows.helpers import rl_spec, spec


class Role:
    def __init__(self) -> None:
        self.alive = True
        self.restarts = 0
        self.fail_restart = False

    async def restart(self) -> None:
        if self.fail_restart:
            raise RuntimeError("cannot redeploy (injected)")
        await asyncio.sleep(0)  # a redeploy takes a while: reports can arrive meanwhile
        self.restarts += 1
        self.alive = True

    async def probe(self) -> None:
        if not self.alive:
            raise ServiceUnavailableError("dead")


def test_missed_heartbeats_restart_only_the_silent_role() -> None:
    async def main() -> None:
        clock = FakeClock()
        hm = HealthManager(clock, heartbeat_timeout_s=10)
        a, b = Role(), Role()
        hm.register("a", a.restart)
        hm.register("b", b.restart)
        clock.advance(8)
        hm.heartbeat("b")
        await hm.check()
        assert a.restarts == b.restarts == 0
        clock.advance(5)  # a: 13 s silent, b: 5 s
        await hm.check()
        assert a.restarts == 1 and b.restarts == 0
        kinds = [e.kind for e in hm.events_of("a")]
        assert kinds == ["registered", "heartbeat_missed", "restart_started", "restarted"]
        assert {s.role: s.state for s in hm.status()} == {"a": "healthy", "b": "healthy"}

    asyncio.run(main())


def test_probe_failure_and_error_reports_restart_and_coalesce() -> None:
    async def main() -> None:
        hm = HealthManager(FakeClock(), heartbeat_timeout_s=None)
        role = Role()
        hm.register("r", role.restart, probe=role.probe)
        role.alive = False
        await hm.check()
        assert role.restarts == 1 and role.alive
        # Two reports of one failure while it is being handled: one restart.
        results = await asyncio.gather(
            hm.report_error("r", RuntimeError("x")), hm.report_error("r", "y")
        )
        assert results == [True, True]
        assert role.restarts == 2
        assert [e.kind for e in hm.events].count("restart_started") == 2

    asyncio.run(main())


def test_budget_exhaustion_and_shared_roles_escalate_to_a_global_restart() -> None:
    async def main() -> None:
        reasons: list[str] = []

        async def global_restart(reason: str) -> None:
            reasons.append(reason)

        hm = HealthManager(FakeClock(), default_budget=2, on_global_restart=global_restart)
        role = Role()
        hm.register("r", role.restart)
        assert await hm.report_error("r", "boom 1")
        assert await hm.report_error("r", "boom 2")
        assert not await hm.report_error("r", "boom 3")  # budget of 2 spent
        assert role.restarts == 2
        assert hm.escalated is not None and len(reasons) == 1
        assert hm.events[-1].kind == "global_restart"
        assert {s.role: s.state for s in hm.status()}["r"] == "failed"

        hm2 = HealthManager(FakeClock(), on_global_restart=global_restart)
        coord = Role()
        hm2.register("scheduler", coord.restart, shared=True)
        assert not await hm2.report_error("scheduler", "lost")
        assert coord.restarts == 0 and len(reasons) == 2

    asyncio.run(main())


def test_failed_restart_is_recorded_and_retried() -> None:
    async def main() -> None:
        hm = HealthManager(FakeClock(), heartbeat_timeout_s=None)
        role = Role()
        role.fail_restart = True
        hm.register("r", role.restart, probe=role.probe)
        role.alive = False
        await hm.check()
        assert hm.events[-1].kind == "restart_failed"
        role.fail_restart = False
        await hm.check()
        assert role.alive and hm.events[-1].kind == "restarted"

    asyncio.run(main())


@pytest.fixture
def base(tiny_backbone: Any) -> ResidentBaseModel:  # noqa: F811
    backbone: ResidentBaseModel = tiny_backbone("qwen2_5_vl")
    return backbone


def test_killed_inference_engine_restarts_with_the_published_weights(
    base: ResidentBaseModel,
) -> None:
    async def main() -> None:
        factory = Factory(base)
        hm = HealthManager(FakeClock(), heartbeat_timeout_s=None)
        pool = EnginePool(
            factory, on_engine_failure=lambda i, e: hm.report_error(f"inference/{i}", e)
        )
        await pool.start(1)
        await pool.add_tenant(tenant("a"))
        await pool.add_tenant(tenant("b", seed=1))
        engine = factory.started[0]
        for tid, v in (("a", 3), ("b", 7)):
            weights = {n: t * 1.5 for n, t in engine.serving_slot(tid).state_tensors().items()}
            await pool.load_weights(tid, v, weights)
        before = {tid: await pool.predict(obs(), tid) for tid in ("a", "b")}

        async def probe() -> None:
            if not pool.engine(0).inference_queue.running:
                raise ServiceUnavailableError("engine stopped")

        hm.register("inference/0", lambda: pool.restart_engine(0), probe=probe)
        await engine.stop()  # the role dies
        with pytest.raises(ServiceUnavailableError):
            await pool.predict(obs(), "a")
        for _ in range(20):  # the failure report restarts it in the background
            await asyncio.sleep(0.01)
            if hm.events[-1].kind == "restarted":
                break
        assert hm.events[-1].kind == "restarted"
        restarted = pool.engine(0)
        assert restarted is not engine and restarted.inference_queue.running
        for tid, v in (("a", 3), ("b", 7)):
            after = await pool.predict(obs(), tid)
            assert after.policy_version == before[tid].policy_version == v
            np.testing.assert_array_equal(after.actions, before[tid].actions)
        await pool.stop()

    asyncio.run(main())


def test_inference_role_killed_during_a_mixed_workload(
    tmp_path: Path, tiny_model: str, reach2d_demos: Path
) -> None:
    out = tmp_path / "out"
    specs = [
        rl_spec("rl", tiny_model, out, target=3, horizon=6, num_envs=2, episode_steps=6),
        spec(
            {
                "tenant": "sft",
                "task": "sft",
                "base_model": {"id": tiny_model},
                "dataset": {"path": str(reach2d_demos), "heldout_fraction": 0.2},
                "action_module": {"type": "oft", "hidden_dim": 64, "num_blocks": 1},
                "algorithm": {"name": "sft", "samples_per_job": 32, "microbatch_size": 16},
                "scheduling": {"completion_target": 3, "prefetch": 2},
                "output_dir": str(out),
            }
        ),
    ]
    opened: list[LocalRun] = []
    killed: list[Any] = []

    def on_progress(rows: list[TenantProgress]) -> None:
        rl = next(r for r in rows if r.tenant == "rl")
        if not killed and rl.completed >= 1:
            run = opened[0]
            assert run.plane is not None and run.plane.pool is not None
            engine = run.plane.pool.engine(0)
            killed.append(engine)
            asyncio.get_running_loop().create_task(engine.stop())

    summary = asyncio.run(
        run_workloads(
            specs,
            tmp_path / "run",
            placement=EnginePoolPlacement(engines=1),
            health_check_s=0.05,
            on_progress=on_progress,
            on_open=opened.append,
        )
    )
    assert killed, "the workload finished before the kill"
    (run,) = opened
    assert run.plane is not None
    kinds = [e.kind for e in run.health.events_of("inference/0")]
    assert "restarted" in kinds and run.health.escalated is None
    sched = run.plane.scheduler  # closed with the run; its job index stays queryable
    s = summary.tenants
    assert {t.state for t in s.values()} == {"completed"}, {t: x.errors for t, x in s.items()}
    for tid in ("rl", "sft"):
        jobs = sched.list_jobs(tenant_id=tid)
        assert all(j.is_terminal for j in jobs)
        assert s[tid].jobs_completed >= 3
    # The other tenant was untouched; the RL tenant lost at most the rollout in flight.
    assert s["sft"].jobs_failed == 0
    assert s["rl"].jobs_failed <= 1
    assert all(
        j.state in (JobState.COMPLETED, JobState.FAILED) for j in sched.list_jobs(tenant_id="rl")
    )
    assert run.plane.queue.partitions() == [] and run.plane.queue.nbytes == 0
    assert s["rl"].final_version == s["rl"].jobs_completed


def test_inference_role_past_its_budget_fails_the_live_workloads(
    tmp_path: Path, tiny_model: str, reach2d_demos: Path
) -> None:
    # An escalation (no restart left for the killed engine) is a global restart: the
    # plane is rebuilt and each live workload resumes within its own restart budget —
    # here 0 (recovery_budget=0), so every live workload ends failed with the
    # escalation reason, and the run returns its summary with the reason in each
    # tenant's ``errors`` (and the workload status's ``error``).
    out = tmp_path / "out"
    far = 40  # far from done at the kill: both workloads are surely live then
    specs = [
        rl_spec("rl", tiny_model, out, target=far, horizon=6, num_envs=2, episode_steps=6),
        spec(
            {
                "tenant": "sft",
                "task": "sft",
                "base_model": {"id": tiny_model},
                "dataset": {"path": str(reach2d_demos), "heldout_fraction": 0.2},
                "action_module": {"type": "oft", "hidden_dim": 64, "num_blocks": 1},
                "algorithm": {"name": "sft", "samples_per_job": 32, "microbatch_size": 16},
                "scheduling": {"completion_target": far, "prefetch": 2},
                "output_dir": str(out),
            }
        ),
    ]
    opened: list[LocalRun] = []
    killed: list[Any] = []

    def on_progress(rows: list[TenantProgress]) -> None:
        rl = next(r for r in rows if r.tenant == "rl")
        if not killed and rl.completed >= 1:
            run = opened[0]
            assert run.plane is not None and run.plane.pool is not None
            engine = run.plane.pool.engine(0)
            killed.append(engine)
            asyncio.get_running_loop().create_task(engine.stop())

    summary = asyncio.run(
        run_workloads(
            specs,
            tmp_path / "run",
            placement=EnginePoolPlacement(engines=1),
            health_check_s=0.05,
            recovery_budget=0,
            on_progress=on_progress,
            on_open=opened.append,
        )
    )
    assert killed, "the workload finished before the kill"
    (run,) = opened
    assert run.plane is not None and run.master is not None
    escalated = run.health.escalated
    assert escalated is not None and escalated.startswith("inference/0"), escalated
    kinds = [e.kind for e in run.health.events_of("inference/0")]
    assert "budget_exhausted" in kinds and "restarted" not in kinds, kinds
    for tid in ("rl", "sft"):
        st = run.master.reporter.status(tid, run.workload_ids[tid])
        assert st.state.value == "failed", (tid, st)
        assert st.error is not None and st.error.startswith("global_restart:"), st.error
        assert "inference/0" in st.error
        t = summary.tenants[tid]
        assert t.state == "failed" and st.error in t.errors, t
        assert t.jobs_completed < far
        assert all(j.is_terminal for j in run.plane.scheduler.list_jobs(tenant_id=tid))
    assert run.plane.queue.partitions() == [] and run.plane.queue.nbytes == 0
