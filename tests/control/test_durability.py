"""SQLite persistence: restart recovery, sequence counters, lease re-leasing."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from joynexus.control.job import JobState
from joynexus.control.scheduler import TrainingScheduler
from joynexus.control.store import InMemoryJobStore, JobRecord, SQLiteJobStore
from joynexus.errors import InternalError, InvalidRequestError, StaleLeaseError
from joynexus.utils.clock import FakeClock

from .conftest import make_ready, reserve

S = JobState


def test_restart_recovers_every_job_and_releases_dead_leases(tmp_path: Path) -> None:
    db = tmp_path / "run" / "scheduler.db"
    clock = FakeClock()
    first = TrainingScheduler.open(db, clock=clock, lease_ttl_s=10.0)
    done = make_ready(first, reserve(first, "a", metadata={"schema_signature": "s", "n": [1, 2]}))
    leased = first.lease_next("actor", ["vla"])
    assert leased is not None
    first.complete(leased.job_id, leased.lease_epoch, metadata={"actor_versions": {"a": 2}})
    ready = make_ready(first, reserve(first, "a"))
    in_lease = make_ready(first, reserve(first, "b", task="rl", behavior_policy_version=4))
    taken = first.lease_next("actor", ["vla"])
    assert taken is not None and taken.job_id == ready.job_id
    producing = reserve(first, "c", task="rl")
    handed = first.hand_off(reserve(first, "d", task="rl").job_id)
    failed = first.fail(reserve(first, "e").job_id, "bad data")
    before = {j.job_id: j for j in first.list_jobs()}
    counters = first.counters()
    # the process dies: no close(), and a new clock timeline starts
    del first

    clock2 = FakeClock(start=5.0)
    second = TrainingScheduler.open(db, clock=clock2, lease_ttl_s=10.0)
    after = {j.job_id: j for j in second.list_jobs()}
    assert after.keys() == before.keys()
    for job_id, job in before.items():
        again = after[job_id]
        assert again.model_dump(exclude={"lease_expires_at"}) == job.model_dump(
            exclude={"lease_expires_at"}
        )
        # leases get one fresh TTL on the new clock; unleased jobs stay unleased
        if job.lease_expires_at is None:
            assert again.lease_expires_at is None
        else:
            assert again.lease_expires_at == clock2.now() + 10.0
    assert second.counters() == counters
    assert after[done.job_id].metadata == {
        "schema_signature": "s",
        "n": [1, 2],
        "actor_versions": {"a": 2},
    }
    assert after[failed.job_id].terminal_reason == "bad data"

    # ready work is leasable at once, in its old order
    nxt = second.lease_next("actor", ["vla"])
    assert nxt is not None and nxt.job_id == in_lease.job_id
    fwd = second.lease_stage("reserved", "actor", "vla", "computing_actor_forward")
    assert fwd is not None and fwd.job_id == handed.job_id  # not the one still producing
    # the dead holder's lease expires and the job is leased again with a new epoch
    clock2.advance(10.0)
    relet = second.lease_next("actor", ["vla"])
    assert relet is not None and relet.job_id == ready.job_id
    assert relet.attempts == 1 and relet.lease_epoch == taken.lease_epoch + 1
    with pytest.raises(StaleLeaseError):
        second.complete(taken.job_id, taken.lease_epoch)
    assert second.get(producing.job_id).terminal_reason == "producer_lost"
    # sequence counters continue where the dead process stopped
    new = reserve(second, "f")
    assert new.created_seq == max(j.created_seq for j in before.values()) + 1
    assert make_ready(second, new).ready_seq == max(j.ready_seq or 0 for j in second.list_jobs())
    assert new.ready_seq is None
    second.close()

    third = TrainingScheduler.open(db, clock=FakeClock(), lease_ttl_s=10.0)
    assert third.get(relet.job_id).lease_epoch == relet.lease_epoch
    assert third.counters() == counters_from_list_jobs(third)
    third.close()


def counters_from_list_jobs(sched: TrainingScheduler) -> dict[str, object]:
    """Counters recomputed from list_jobs (what counters() must equal)."""
    by_state = {s.value: 0 for s in JobState}
    by_tenant: dict[str, dict[str, int]] = {}
    jobs = sched.list_jobs()
    for job in jobs:
        by_state[job.state.value] += 1
        by_tenant.setdefault(job.tenant_id, {s.value: 0 for s in JobState})[job.state.value] += 1
    return {"total": len(jobs), "by_state": by_state, "by_tenant": by_tenant}


def test_database_is_wal_and_every_transition_is_committed(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    sched = TrainingScheduler.open(db, clock=FakeClock())
    job = reserve(sched)
    sched.mark(job.job_id, "ready")
    # another connection sees the committed state immediately
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        (state,) = conn.execute("SELECT state FROM jobs WHERE job_id = ?", (job.job_id,)).fetchone()
    assert state == "ready"
    sched.close()


def test_schema_version_mismatch_is_reported(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    SQLiteJobStore(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(InvalidRequestError, match="schema version 99"):
        SQLiteJobStore(db)


class _FlakyStore(InMemoryJobStore):
    def __init__(self) -> None:
        super().__init__()
        self.fail_next = False

    def write(self, records: Sequence[JobRecord]) -> None:
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk full")
        super().write(records)


def test_failed_write_rolls_memory_back_to_the_store() -> None:
    store = _FlakyStore()
    sched = TrainingScheduler(store, clock=FakeClock())
    job = reserve(sched)
    store.fail_next = True
    with pytest.raises(InternalError, match="disk full"):
        sched.mark(job.job_id, "ready")
    assert sched.get(job.job_id).state is S.RESERVED
    assert sched.lease_next("actor", ["vla"]) is None
    assert sched.mark(job.job_id, "ready").state is S.READY


def test_in_memory_store_recovers_like_sqlite() -> None:
    store = InMemoryJobStore()
    clock = FakeClock()
    first = TrainingScheduler(store, clock=clock)
    job = make_ready(first, reserve(first))
    second = TrainingScheduler(store, clock=clock)
    assert second.get(job.job_id) == first.get(job.job_id)
    assert second.lease_next("actor", "vla") is not None


def test_out_of_range_ints_and_huge_metadata_never_reach_the_store(tmp_path: Path) -> None:
    """Issue 12: a 2**80 staleness or version was an OverflowError in SQLite (500 and a
    full reload); a 200 MB metadata lived in scheduler.sqlite forever."""
    from joynexus.errors import PayloadTooLargeError

    sched = TrainingScheduler.open(tmp_path / "s.sqlite", clock=FakeClock(), lease_ttl_s=10.0)
    kept = reserve(sched)
    for field in ("max_policy_staleness", "behavior_policy_version", "sample_count"):
        with pytest.raises(InvalidRequestError, match="64-bit") as info:
            reserve(sched, "t1", "rl", **{field: 2**80})
        assert info.value.details["field"] == field
    with pytest.raises(PayloadTooLargeError, match="metadata"):
        reserve(sched, metadata={"blob": "x" * (2 << 20)})
    small = TrainingScheduler.in_memory(max_metadata_bytes=64)
    job = reserve(small, metadata={"a": 1})
    small.mark(job.job_id, JobState.READY)
    leased = small.lease_next("actor", ["vla"])
    assert leased is not None
    with pytest.raises(PayloadTooLargeError):  # the merged metadata is bounded too
        small.complete(leased.job_id, leased.lease_epoch, {"b": "y" * 100})
    # Nothing was half-written: the one good job is all the store holds.
    assert [j.job_id for j in sched.list_jobs()] == [kept.job_id]
    sched.close()
