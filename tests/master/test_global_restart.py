"""A global restart restarts (issue 28, item 7; paper §4.1.3).

Real Master and Health Manager on the fake plane: a shared role whose probe fails
escalates; the plane is "rebuilt" and every live workload resumes from its
checkpoints within its own restart budget; past that budget the workloads fail, and
an operator can resume one of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from joynexus.api import WorkloadState
from joynexus.control.job import JobState
from joynexus.errors import ConflictError, ServiceUnavailableError
from joynexus.master.global_restart import global_restart
from joynexus.runtime.budgets import RecoveryBudget
from joynexus.runtime.health import HealthManager
from joynexus.utils.clock import FakeClock
from tests.fakes.plane import FakeServer, checkpointed_state, rl_spec

TENANTS = ("alice", "bob")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeServer]:
    srv = FakeServer(tmp_path / "run")
    yield srv
    srv.close()


def test_a_global_restart_resumes_every_live_workload_then_fails_past_its_budget(
    server: FakeServer,
) -> None:
    m = server.master
    clock = FakeClock()
    health = HealthManager(clock, default_budget=1, window_s=100.0, heartbeat_timeout_s=None)
    m.supervisor.workload_restarts = RecoveryBudget(1, 100.0, clock)
    broken = [False]
    rebuilds: list[str] = []

    async def probe() -> None:
        if broken[0]:
            raise ServiceUnavailableError("the coordinator actor died")

    async def cannot_restart() -> None:  # a shared role never restarts in place
        raise AssertionError("a shared role must escalate")

    async def rebuild() -> None:
        rebuilds.append("rebuilt")
        broken[0] = False

    async def on_global_restart(reason: str) -> None:
        await global_restart(m, health, reason, rebuild)

    health.register("coordinator", cannot_restart, probe=probe, shared=True)
    health.on_global_restart = on_global_restart
    ids = {
        t: server.run(m.lifecycle.submit(rl_spec(t, target=100_000), t)).workload_id
        for t in TENANTS
    }

    def completed(tenant: str) -> int:
        return m.reporter.status(tenant, ids[tenant]).jobs_completed

    for t in TENANTS:
        server.run_until(lambda t=t: completed(t) >= 2, what=f"{t} trained")
    before = {t: completed(t) for t in TENANTS}

    broken[0] = True
    server.run(health.check())
    assert rebuilds == ["rebuilt"] and health.escalated is None
    for t in TENANTS:
        st = m.reporter.status(t, ids[t])
        assert not st.state.is_terminal and st.error is None and st.restarts == 1, st
        # Resumed from its checkpoint, and trains on.
        server.run_until(lambda t=t: completed(t) >= before[t] + 2, what=f"{t} resumed")
        ck = checkpointed_state(server.plane.output_root, t)
        assert ck is not None and ck["version"] >= before[t]

    # Broken again within the window: each workload's one restart is spent.
    rebuilds.clear()
    broken[0] = True
    server.run(health.check())
    for t in TENANTS:
        st = m.reporter.status(t, ids[t])
        assert st.state is WorkloadState.FAILED, st
        assert st.error is not None and st.error.startswith("global_restart:"), st.error
        assert "coordinator" in st.error and "restarts spent" in st.error
        assert all(j.is_terminal for j in server.plane.scheduler.list_jobs(tenant_id=t)), (
            "a failed workload left jobs in flight"
        )
    assert health.escalated is not None  # nothing resumed: readiness stays red

    # An operator resumes one of them once the cause is fixed; the other stays failed.
    done = completed("alice")
    st = server.run(m.lifecycle.resume("alice", ids["alice"]))
    assert st.state is WorkloadState.STARTING and st.error is None and st.restarts == 2
    server.run_until(lambda: completed("alice") >= done + 2, what="alice resumed by operator")
    assert m.reporter.status("alice", ids["alice"]).state is WorkloadState.RUNNING
    assert m.reporter.status("bob", ids["bob"]).state is WorkloadState.FAILED
    # Only a workload the service failed is resumable: a cancelled one is not.
    server.run(m.lifecycle.cancel("alice", ids["alice"]))
    with pytest.raises(ConflictError, match="not paused"):
        server.run(m.lifecycle.resume("alice", ids["alice"]))
    assert not server.plane.scheduler.list_jobs(tenant_id="alice", state=JobState.LEASED)
