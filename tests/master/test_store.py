"""Durable workload records: what a restarted Master reads back."""

from __future__ import annotations

from pathlib import Path

from joynexus.api import WorkloadState
from joynexus.control.job import JobState, TaskType
from joynexus.control.scheduler import TrainingScheduler
from joynexus.master.store import InMemoryWorkloadStore, SQLiteWorkloadStore, WorkloadRecord


def _record(wid: str, seq: int, state: WorkloadState = WorkloadState.RUNNING) -> WorkloadRecord:
    return WorkloadRecord(
        workload_id=wid,
        tenant_id="alice",
        seq=seq,
        spec={"tenant": "alice", "task": "rl"},
        state=state,
        created_at=1.0,
        completed_before=3,
    )


def test_sqlite_records_survive_reopen_in_submission_order(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.sqlite"
    store = SQLiteWorkloadStore(path)
    store.put(_record("wl-2", 2))
    store.put(_record("wl-1", 1))
    store.put(_record("wl-2", 2, WorkloadState.PAUSED))  # replaced, not duplicated
    store.close()
    again = SQLiteWorkloadStore(path)
    loaded = again.load()
    assert [r.workload_id for r in loaded] == ["wl-1", "wl-2"]
    assert loaded[1].state is WorkloadState.PAUSED
    assert loaded[0].completed_before == 3
    again.close()


def test_records_share_the_scheduler_database(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.sqlite"
    sched = TrainingScheduler.open(path)
    store = SQLiteWorkloadStore(path)
    store.put(_record("wl-1", 1))
    job = sched.reserve(
        policy_key="alice/rl",
        domain="vla",
        tenant_id="alice",
        task_type=TaskType.SFT,
        sample_count=1,
        producer_role="sft",
        consumer_role="actor",
        metadata={"workload_id": "wl-1"},
    )
    assert job is not None
    sched.close()
    store.close()
    sched2 = TrainingScheduler.open(path)
    assert sched2.get(job.job_id).metadata["workload_id"] == "wl-1"
    assert [r.workload_id for r in SQLiteWorkloadStore(path).load()] == ["wl-1"]
    sched2.close()


def test_in_memory_store_returns_copies() -> None:
    store = InMemoryWorkloadStore()
    rec = _record("wl-1", 1)
    store.put(rec)
    rec.state = WorkloadState.FAILED
    assert store.load()[0].state is WorkloadState.RUNNING


def test_complete_recovered_completes_from_any_live_state() -> None:
    sched = TrainingScheduler.in_memory(lease_ttl_s=10.0)
    args = dict(
        policy_key="a/sft",
        domain="vla",
        tenant_id="a",
        task_type=TaskType.SFT,
        sample_count=1,
        producer_role="sft",
        consumer_role="actor",
    )
    ready = sched.reserve(**args)  # type: ignore[arg-type]
    assert ready is not None
    sched.mark(ready.job_id, JobState.READY, lease_epoch=ready.lease_epoch)
    assert sched.complete_recovered(ready.job_id).state is JobState.COMPLETED
    assert sched.complete_recovered(ready.job_id).state is JobState.COMPLETED  # idempotent
    failed = sched.reserve(**args)  # type: ignore[arg-type]
    assert failed is not None
    sched.fail(failed.job_id, "x")
    import pytest

    from joynexus.errors import IllegalTransitionError

    with pytest.raises(IllegalTransitionError, match="cannot be recovered"):
        sched.complete_recovered(failed.job_id)
