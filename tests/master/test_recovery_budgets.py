"""Recovery budgets per tenant over a sliding window (issue 28, item 6).

Real Master, Health Manager and session recovery on the fake plane; the budgets run on
a FakeClock of their own, so the window slides only when the test says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from joynexus.api import WorkloadState
from joynexus.errors import InvalidRequestError
from joynexus.runtime.budgets import RecoveryBudget
from joynexus.runtime.health import HealthManager
from joynexus.runtime.sessions import SessionRecovery
from joynexus.utils.clock import FakeClock
from tests.fakes.plane import FakeServer, rl_spec

WINDOW_S = 100.0
BUDGET = 2


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeServer]:
    # Crashed rollouts fail jobs: the job-failure budget must not be what ends a workload.
    srv = FakeServer(tmp_path / "run", max_failures=1000)
    yield srv
    srv.close()


def test_recovery_budget_slides_and_is_counted_per_key() -> None:
    clock = FakeClock()
    budget = RecoveryBudget(2, 10.0, clock)
    assert budget.charge("a") and budget.charge("a")
    assert not budget.charge("a") and budget.spent("a")
    assert budget.charge("b")  # another key has its own count
    clock.advance(10.0)  # both charges of "a" left the window
    assert budget.used("a") == 0 and budget.charge("a")
    whole_life = RecoveryBudget(1, None, clock)
    assert whole_life.charge() and not whole_life.charge()
    clock.advance(1e9)
    assert whole_life.spent()


@pytest.mark.parametrize(("limit", "window_s"), [(-1, 10.0), (1, 0.0), (1, -5.0)])
def test_a_budget_that_cannot_be_kept_is_refused_with_the_value(
    limit: int, window_s: float
) -> None:
    with pytest.raises(InvalidRequestError, match=r"got -?\d"):
        RecoveryBudget(limit, window_s, FakeClock())


def test_one_tenants_spent_budget_fails_only_its_workload(server: FakeServer) -> None:
    m = server.master
    env = server.plane.env
    clock = FakeClock()
    health = HealthManager(
        clock, default_budget=BUDGET, window_s=WINDOW_S, heartbeat_timeout_s=None
    )
    escalations: list[str] = []

    async def global_restart(reason: str) -> None:  # what MasterHost wires
        escalations.append(reason)
        await m.supervisor.fail_live(f"global_restart: {reason}")

    health.on_global_restart = global_restart
    SessionRecovery(
        env, m.reporter.session_holders, health, on_exhausted=m.supervisor.fail_holder
    ).register()
    ids = {
        t: server.run(m.lifecycle.submit(rl_spec(t, target=100_000), t)).workload_id
        for t in ("alice", "bob")
    }

    def session(tenant: str) -> str | None:
        t = m.reporter.tenant_of(ids[tenant])
        return None if t is None else t.session_id

    def crash_and_check(tenant: str) -> str:
        server.run_until(lambda: session(tenant) is not None, what=f"{tenant} has a session")
        sid = session(tenant)
        assert sid is not None
        env.crash(sid)
        server.run(health.check())
        return sid

    server.run_until(lambda: session("bob") is not None, what="bob has a session")
    bob_session = session("bob")
    # Alice's simulator dies BUDGET times: recreated each time (a new session id).
    alice_sessions = [crash_and_check("alice") for _ in range(BUDGET)]
    assert m.reporter.status("alice", ids["alice"]).state is WorkloadState.RUNNING
    # Once more within the window: her budget is spent — her workload alone fails.
    last = crash_and_check("alice")
    alice = m.reporter.status("alice", ids["alice"])
    assert alice.state is WorkloadState.FAILED, alice
    assert alice.error is not None and "recovery budget spent" in alice.error
    assert last in alice.error
    for foreign in ("bob", ids["bob"], str(bob_session)):
        assert foreign not in alice.error, alice.error
    assert escalations == [] and health.escalated is None
    assert m.reporter.status("bob", ids["bob"]).state is WorkloadState.RUNNING
    assert last not in alice_sessions

    # Bob's budget is his own and refills as the window slides.
    crash_and_check("bob")
    crash_and_check("bob")
    clock.advance(WINDOW_S + 1)
    crash_and_check("bob")
    crash_and_check("bob")
    bob = m.reporter.status("bob", ids["bob"])
    assert bob.state is WorkloadState.RUNNING, bob
    server.run_until(lambda: session("bob") is not None, what="bob's session is recreated")
    assert m.reporter.status("bob", ids["bob"]).error is None
