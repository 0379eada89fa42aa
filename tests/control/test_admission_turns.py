"""RL admission is round-robin across tenants (paper §5.1; issue 28 item 4): three
tenants whose loops ask again the moment their own rollout ends cannot keep a fourth
tenant at zero jobs, and reservations made by hand over the API cannot hold the
workloads' places. Deterministic: a FakeClock, and a fixed order of asking."""

from __future__ import annotations

from joynexus.control.admission import (
    REFUSED_GLOBAL_MAX_ACTIVE,
    REFUSED_GLOBAL_TURN,
    GlobalLimit,
)
from joynexus.control.job import JobState, TaskType, TrainingJob
from joynexus.control.scheduler import TrainingScheduler
from joynexus.utils.clock import FakeClock

ROLLOUT = "rollout"


def _limit(roles: frozenset[str] | None = frozenset({ROLLOUT})) -> GlobalLimit:
    return GlobalLimit(
        task_type=TaskType.RL, max_active=3, max_active_per_tenant=1, producer_roles=roles
    )


def _ask(sched: TrainingScheduler, tenant: str, role: str = ROLLOUT) -> TrainingJob | None:
    return sched.reserve(
        policy_key=f"{tenant}/rl",
        domain="vla",
        tenant_id=tenant,
        task_type=TaskType.RL,
        sample_count=8,
        producer_role=role,
        consumer_role="actor",
    )


def _rollout_done(sched: TrainingScheduler, job: TrainingJob) -> None:
    sched.mark(job.job_id, JobState.NEEDS_ADVANTAGES, lease_epoch=job.lease_epoch)


def _jobs_of_latecomer(sched: TrainingScheduler, clock: FakeClock, rounds: int) -> int:
    """a, b and c hold the three places; each round one of them finishes its rollout
    and its loop asks again at once, before d's loop asks. How many jobs d gets."""
    held = {t: _ask(sched, t) for t in "abc"}
    assert all(held.values())
    got = 0
    for i in range(rounds):
        clock.advance(0.1)
        tenant = "abc"[i % 3]
        job = held[tenant]
        assert job is not None
        _rollout_done(sched, job)
        again = _ask(sched, tenant)  # the finished tenant asks first
        late = _ask(sched, "d")
        if late is not None:
            got += 1
            _rollout_done(sched, late)
        held[tenant] = again if again is not None else _ask(sched, tenant)
        if held[tenant] is None:  # its turn is after d's: it asks on its next poll
            held[tenant] = _ask(sched, tenant)
    return got


def test_a_fourth_tenant_gets_its_turn() -> None:
    clock = FakeClock()
    sched = TrainingScheduler.in_memory(clock=clock)
    sched.set_global_limit(_limit())
    held = [_ask(sched, t) for t in "abc"]
    assert all(held) and _ask(sched, "d") is None  # the three places are taken
    assert sched.last_refusal("d", TaskType.RL) == REFUSED_GLOBAL_MAX_ACTIVE
    first = held[0]
    assert first is not None
    _rollout_done(sched, first)
    # A place is free, but d has waited and a was admitted after it asked: d's turn.
    assert _ask(sched, "a") is None
    assert sched.last_refusal("a", TaskType.RL) == REFUSED_GLOBAL_TURN
    assert _ask(sched, "d") is not None
    assert sched.refusals()[REFUSED_GLOBAL_TURN] == 1


def test_round_robin_keeps_a_latecomer_admitted_under_contention() -> None:
    clock = FakeClock()
    sched = TrainingScheduler.in_memory(clock=clock)
    sched.set_global_limit(_limit())
    got = _jobs_of_latecomer(sched, clock, rounds=30)
    print(f"latecomer's jobs in 30 rounds of contention: {got}")
    assert got >= 7  # about one place in four (FIFO-by-asking gives it none)


def test_a_tenant_that_stopped_asking_gives_up_its_turn() -> None:
    clock = FakeClock()
    sched = TrainingScheduler.in_memory(clock=clock, turn_ttl_s=5.0)
    sched.set_global_limit(_limit())
    held = [_ask(sched, t) for t in "abc"]
    assert _ask(sched, "d") is None  # d waits ... then goes away
    clock.advance(6.0)
    first = held[0]
    assert first is not None
    _rollout_done(sched, first)
    assert _ask(sched, "a") is not None  # nobody is waiting any more


def test_reservations_by_hand_do_not_hold_the_workloads_places() -> None:
    clock = FakeClock()
    sched = TrainingScheduler.in_memory(clock=clock)
    sched.set_global_limit(_limit())
    # Three tenants reserve RL jobs by hand (API roles are "<tenant>/<role>") and keep
    # them alive with heartbeats.
    manual = [_ask(sched, t, role=f"{t}/{ROLLOUT}") for t in "xyz"]
    assert all(manual)
    for _ in range(20):
        clock.advance(5.0)
        for job in manual:
            assert job is not None
            sched.heartbeat(job.job_id, job.lease_epoch)
    # A workload's rollout is admitted all the same.
    assert _ask(sched, "d") is not None
    # Without the role filter (the old bound) the same three would have kept it out.
    old = TrainingScheduler.in_memory(clock=clock)
    old.set_global_limit(_limit(roles=None))
    assert all(_ask(old, t, role=f"{t}/{ROLLOUT}") for t in "xyz")
    assert _ask(old, "d") is None
