"""Lease order, expiry, heartbeats, fencing and idempotent completion."""

from __future__ import annotations

import asyncio
import threading

import pytest

from joynexus.control.admission import AdmissionPolicy
from joynexus.control.job import JobState
from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import (
    ConflictError,
    IllegalTransitionError,
    InvalidRequestError,
    JobNotFoundError,
    StaleLeaseError,
)
from joynexus.utils.clock import FakeClock

from .conftest import make_ready, reserve

S = JobState


def test_lease_next_serves_priority_then_ready_seq_fifo(sched: TrainingScheduler) -> None:
    sched.set_policy("hi", "sft", AdmissionPolicy(priority=5))
    sched.set_policy("mid", "sft", AdmissionPolicy(priority=1))
    low1, low2 = reserve(sched, "low"), reserve(sched, "low")
    hi1, hi2 = reserve(sched, "hi"), reserve(sched, "hi")
    mid = reserve(sched, "mid")
    # readiness order differs from creation order: ready_seq, not created_seq, decides
    for job in (low2, hi2, mid, low1, hi1):
        make_ready(sched, job)
    order = []
    while (leased := sched.lease_next("actor", ["vla"])) is not None:
        order.append(leased.job_id)
    assert order == [j.job_id for j in (hi2, hi1, mid, low2, low1)]


def test_lease_next_filters_consumer_role_and_domains(sched: TrainingScheduler) -> None:
    a = make_ready(sched, reserve(sched, domain="sim-a"))
    b = make_ready(sched, reserve(sched, domain="sim-b"))
    c = make_ready(sched, reserve(sched, domain="sim-a", consumer_role="critic"))
    assert sched.lease_next("actor", ["vla"]) is None
    assert sched.lease_next("critic", ["sim-b"]) is None
    got = sched.lease_next("actor", ["sim-b", "sim-a"])
    assert got is not None and got.job_id == a.job_id  # older ready_seq wins across domains
    got = sched.lease_next("actor", "sim-b")
    assert got is not None and got.job_id == b.job_id
    got = sched.lease_next("critic", ["sim-a"])
    assert got is not None and got.job_id == c.job_id


def test_lease_stage_validates_the_state_pair(sched: TrainingScheduler) -> None:
    with pytest.raises(InvalidRequestError, match="stage leases"):
        sched.lease_stage("ready", "actor", "vla", "computing_advantages")
    with pytest.raises(InvalidRequestError, match="unknown job state"):
        sched.lease_stage("bogus", "actor", "vla", "leased")


def test_producing_job_is_not_leasable_by_actor_forward(sched: TrainingScheduler) -> None:
    job = reserve(sched, task="rl")
    assert sched.lease_stage("reserved", "actor", "vla", "computing_actor_forward") is None
    sched.hand_off(job.job_id, job.lease_epoch)
    assert sched.hand_off(job.job_id).state is S.RESERVED  # idempotent
    got = sched.lease_stage("reserved", "actor", "vla", "computing_actor_forward")
    assert got is not None and got.job_id == job.job_id
    sft = reserve(sched, task="sft")
    with pytest.raises(IllegalTransitionError, match="actor-forward"):
        sched.hand_off(sft.job_id)


def test_expired_lease_returns_to_leased_from_state(
    sched: TrainingScheduler, clock: FakeClock
) -> None:
    job = reserve(sched, task="rl")
    sched.mark(job.job_id, "needs_advantages")
    staged = sched.lease_stage("needs_advantages", "actor", "vla", "computing_advantages")
    assert staged is not None and staged.lease_expires_at == clock.now() + 10.0
    clock.advance(9.99)
    assert sched.expire_leases() == []
    clock.advance(0.01)
    (expired,) = sched.expire_leases()
    assert expired.state is S.NEEDS_ADVANTAGES and expired.attempts == 1
    assert expired.lease_expires_at is None
    again = sched.lease_stage("needs_advantages", "actor", "vla", "computing_advantages")
    assert again is not None and again.lease_epoch == staged.lease_epoch + 1
    ready = sched.mark(job.job_id, "ready", lease_epoch=again.lease_epoch)
    leased = sched.lease_next("actor", ["vla"])
    assert leased is not None
    clock.advance(10.0)
    # expiry also runs lazily inside lease calls: the job is leased again at once
    released = sched.lease_next("actor", ["vla"])
    assert released is not None and released.job_id == job.job_id
    assert released.attempts == 2 and released.ready_seq == ready.ready_seq
    clock.advance(10.0)
    (exhausted,) = sched.expire_leases()
    assert exhausted.state is S.FAILED and exhausted.terminal_reason == "attempts_exhausted"
    assert exhausted.attempts == 3


def test_actor_forward_expiry_returns_to_reserved(
    sched: TrainingScheduler, clock: FakeClock
) -> None:
    job = reserve(sched, task="rl")
    sched.hand_off(job.job_id, job.lease_epoch)
    assert sched.lease_stage("reserved", "actor", "vla", "computing_actor_forward")
    clock.advance(10.0)
    (back,) = sched.expire_leases()
    assert back.state is S.RESERVED and back.attempts == 1 and not back.has_lease
    assert sched.lease_stage("reserved", "actor", "vla", "computing_actor_forward") is not None


def test_expired_lease_goes_back_to_its_fifo_place(
    sched: TrainingScheduler, clock: FakeClock
) -> None:
    first = make_ready(sched, reserve(sched))
    second = make_ready(sched, reserve(sched))
    leased = sched.lease_next("actor", ["vla"])
    assert leased is not None and leased.job_id == first.job_id
    clock.advance(10.0)
    again = sched.lease_next("actor", ["vla"])
    assert again is not None and again.job_id == first.job_id  # ready_seq kept
    assert sched.get(second.job_id).state is S.READY


def test_heartbeat_extends_and_fencing_rejects_old_epochs(
    sched: TrainingScheduler, clock: FakeClock
) -> None:
    make_ready(sched, reserve(sched))
    lease = sched.lease_next("actor", ["vla"])
    assert lease is not None
    for _ in range(5):
        clock.advance(8.0)
        beat = sched.heartbeat(lease.job_id, lease.lease_epoch)
        assert beat.lease_expires_at == clock.now() + 10.0
    assert sched.expire_leases() == []
    clock.advance(10.0)
    with pytest.raises(StaleLeaseError) as info:
        sched.heartbeat(lease.job_id, lease.lease_epoch)
    assert "no live lease" in info.value.message
    new = sched.lease_next("actor", ["vla"])
    assert new is not None and new.lease_epoch == lease.lease_epoch + 1
    with pytest.raises(StaleLeaseError) as info:
        sched.complete(lease.job_id, lease.lease_epoch)
    assert info.value.details["current_epoch"] == new.lease_epoch
    with pytest.raises(StaleLeaseError):
        sched.fail(lease.job_id, "zombie", lease.lease_epoch)
    with pytest.raises(StaleLeaseError):
        sched.heartbeat(lease.job_id, lease.lease_epoch)
    assert sched.get(lease.job_id).state is S.LEASED
    done = sched.complete(new.job_id, new.lease_epoch)
    assert done.state is S.COMPLETED
    # a duplicate complete is a no-op; a zombie's complete is still rejected
    assert sched.complete(new.job_id, new.lease_epoch) == done
    assert sched.complete(new.job_id) == done
    with pytest.raises(StaleLeaseError):
        sched.complete(lease.job_id, lease.lease_epoch)


def test_stage_mark_is_fenced(sched: TrainingScheduler, clock: FakeClock) -> None:
    job = reserve(sched, task="rl")
    sched.mark(job.job_id, "needs_advantages", lease_epoch=job.lease_epoch)
    with pytest.raises(StaleLeaseError):  # the producer lease ended with the mark
        sched.heartbeat(job.job_id, job.lease_epoch)
    old = sched.lease_stage("needs_advantages", "actor", "vla", "computing_advantages")
    assert old is not None
    clock.advance(10.0)
    new = sched.lease_stage("needs_advantages", "actor", "vla", "computing_advantages")
    assert new is not None
    with pytest.raises(StaleLeaseError):
        sched.mark(job.job_id, "ready", lease_epoch=old.lease_epoch)
    assert sched.mark(job.job_id, "ready", lease_epoch=new.lease_epoch).state is S.READY


def test_producer_lease_heartbeat_and_loss(sched: TrainingScheduler, clock: FakeClock) -> None:
    alive = reserve(sched, task="rl")
    dead = reserve(sched, task="rl")
    for _ in range(3):
        clock.advance(6.0)
        sched.heartbeat(alive.job_id, alive.lease_epoch)
    assert sched.get(dead.job_id).state is S.FAILED
    assert sched.get(dead.job_id).terminal_reason == "producer_lost"
    assert sched.mark(alive.job_id, "needs_advantages", lease_epoch=1).state is S.NEEDS_ADVANTAGES
    with pytest.raises(IllegalTransitionError):
        sched.mark(dead.job_id, "needs_advantages")


def test_producer_ttl_can_differ(clock: FakeClock) -> None:
    sched = TrainingScheduler.in_memory(clock=clock, lease_ttl_s=5.0, producer_lease_ttl_s=100.0)
    job = reserve(sched, task="rl")
    assert job.lease_expires_at == clock.now() + 100.0
    clock.advance(50.0)
    assert sched.get(job.job_id).state is S.RESERVED
    sched.expire_leases()
    assert sched.get(job.job_id).state is S.RESERVED


def test_list_jobs_and_counters_keep_terminal_jobs(sched: TrainingScheduler) -> None:
    a = reserve(sched, "a")
    b = reserve(sched, "b", task="rl")
    c = reserve(sched, "a")
    make_ready(sched, a)
    sched.fail(b.job_id, "crash")
    assert [j.job_id for j in sched.list_jobs()] == [a.job_id, b.job_id, c.job_id]
    assert [j.job_id for j in sched.list_jobs(tenant_id="a")] == [a.job_id, c.job_id]
    assert [j.job_id for j in sched.list_jobs(state="failed")] == [b.job_id]
    assert [j.job_id for j in sched.list_jobs("a", S.READY)] == [a.job_id]
    assert sched.list_jobs("zzz") == [] and len(sched.list_jobs(limit=2)) == 2
    counters = sched.counters()
    assert counters["total"] == 3
    assert counters["by_state"]["failed"] == 1 and counters["by_state"]["reserved"] == 1
    assert counters["by_tenant"]["a"]["ready"] == 1 and counters["by_tenant"]["b"]["failed"] == 1
    with pytest.raises(JobNotFoundError):
        sched.get("job-missing")
    with pytest.raises(JobNotFoundError):
        sched.mark("job-missing", "ready")


def test_wait_for_ready_wakes_a_waiting_thread(sched: TrainingScheduler) -> None:
    job = reserve(sched)
    assert sched.wait_for_ready("actor", ["vla"], timeout_s=0.0) is False
    result: list[bool] = []
    waiter = threading.Thread(
        target=lambda: result.append(sched.wait_for_ready("actor", ["vla"], timeout_s=30.0))
    )
    waiter.start()
    sched.mark(job.job_id, "ready")
    waiter.join(timeout=30.0)
    assert result == [True]


def test_wait_for_ready_sees_leases_that_expire_while_waiting(clock: FakeClock) -> None:
    sched = TrainingScheduler.in_memory(clock=clock, lease_ttl_s=10.0)
    make_ready(sched, reserve(sched))
    assert sched.lease_next("actor", ["vla"]) is not None
    assert sched.wait_for_ready("actor", ["vla"], timeout_s=0.01) is False
    clock.advance(10.0)
    assert sched.wait_for_ready("actor", ["vla"], timeout_s=0.01) is True


def test_async_wait_does_not_block_the_event_loop(sched: TrainingScheduler) -> None:
    job = reserve(sched)

    async def main() -> tuple[bool, bool, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        tick_task = asyncio.create_task(ticker())
        timed_out = await sched.async_wait_for_ready("actor", ["vla"], timeout_s=0.05)
        waiter = asyncio.create_task(sched.async_wait_for_ready("actor", ["vla"], timeout_s=30))
        await asyncio.sleep(0.01)
        # a transition from another thread resolves the waiter thread-safely
        await asyncio.to_thread(sched.mark, job.job_id, "ready")
        woke = await asyncio.wait_for(waiter, timeout=30)
        tick_task.cancel()
        return timed_out, woke, ticks

    timed_out, woke, ticks = asyncio.run(main())
    assert timed_out is False and woke is True
    assert ticks > 10  # the loop kept running other tasks while we waited


def test_closed_scheduler_refuses_calls(sched: TrainingScheduler) -> None:
    job = reserve(sched)
    with sched:
        pass
    with pytest.raises(ConflictError, match="closed"):
        sched.mark(job.job_id, "ready")
    with pytest.raises(ConflictError):
        sched.wait_for_ready("actor", ["vla"], timeout_s=1.0)
    sched.close()  # idempotent


def test_many_ended_leases_do_not_lose_a_live_one(
    sched: TrainingScheduler, clock: FakeClock
) -> None:
    held = make_ready(sched, reserve(sched, "keep"))
    lease = sched.lease_next("actor", ["vla"])
    assert lease is not None and lease.job_id == held.job_id
    for _ in range(3000):  # enough ended leases to force the expiry heap to compact
        make_ready(sched, reserve(sched, "churn"))
        other = sched.lease_next("actor", ["vla"])
        assert other is not None
        sched.complete(other.job_id, other.lease_epoch)
    assert len(sched._ix._deadlines) < 2000  # ended leases were compacted away
    clock.advance(10.0)
    (expired,) = sched.expire_leases()
    assert expired.job_id == held.job_id and expired.state is S.READY


def test_completion_metadata_must_be_json(sched: TrainingScheduler) -> None:
    make_ready(sched, reserve(sched))
    lease = sched.lease_next("actor", ["vla"])
    assert lease is not None
    with pytest.raises(InvalidRequestError, match="JSON"):
        sched.complete(lease.job_id, lease.lease_epoch, metadata={"bad": {1, 2}})
    assert sched.get(lease.job_id).state is S.LEASED
    assert "bad" not in sched.get(lease.job_id).metadata
