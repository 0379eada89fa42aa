"""Many producer and consumer threads on one scheduler: nothing leased twice, nothing lost."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from joynexus.control.admission import AdmissionPolicy
from joynexus.control.job import JobState
from joynexus.control.scheduler import TrainingScheduler

PRODUCERS, CONSUMERS, JOBS_PER_PRODUCER = 4, 4, 60


@pytest.mark.parametrize("durable", [False, True])
def test_threads_reserve_lease_complete(tmp_path: Path, durable: bool) -> None:
    sched = TrainingScheduler.open(tmp_path / "s.db") if durable else TrainingScheduler.in_memory()
    for p in range(PRODUCERS):
        sched.set_policy(f"t{p}", "rl", AdmissionPolicy(max_in_flight=5, priority=p % 2))
    holders: dict[str, int] = {}
    holders_lock = threading.Lock()
    violations: list[str] = []
    completed: list[str] = []
    produced = threading.Semaphore(0)
    total = PRODUCERS * JOBS_PER_PRODUCER
    errors: list[BaseException] = []

    def producer(p: int) -> None:
        try:
            made = 0
            while made < JOBS_PER_PRODUCER:
                job = sched.reserve(
                    policy_key=f"t{p}/rl",
                    domain="vla",
                    tenant_id=f"t{p}",
                    task_type="rl",
                    sample_count=8,
                    producer_role="rollout",
                    consumer_role="actor",
                    behavior_policy_version=0,
                )
                if job is None:  # in-flight bound reached: wait for the consumers
                    sched.wait_for_ready("actor", ["vla"], timeout_s=0.01)
                    continue
                sched.mark(job.job_id, "needs_advantages", lease_epoch=job.lease_epoch)
                stage = sched.lease_stage(
                    "needs_advantages", "actor", "vla", "computing_advantages"
                )
                if stage is not None:
                    sched.mark(stage.job_id, "ready", lease_epoch=stage.lease_epoch)
                made += 1
                produced.release()
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    def consumer() -> None:
        try:
            while True:
                with holders_lock:
                    if len(completed) >= total:
                        return
                stage = sched.lease_stage(
                    "needs_advantages", "actor", "vla", "computing_advantages"
                )
                if stage is not None:
                    sched.mark(stage.job_id, "ready", lease_epoch=stage.lease_epoch)
                job = sched.lease_next("actor", ["vla"])
                if job is None:
                    sched.wait_for_ready("actor", ["vla"], timeout_s=0.01)
                    continue
                with holders_lock:
                    if job.job_id in holders:
                        violations.append(job.job_id)
                    holders[job.job_id] = job.lease_epoch
                sched.heartbeat(job.job_id, job.lease_epoch)
                with holders_lock:
                    del holders[job.job_id]
                    completed.append(job.job_id)
                sched.complete(job.job_id, job.lease_epoch)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(p,)) for p in range(PRODUCERS)]
    threads += [threading.Thread(target=consumer) for _ in range(CONSUMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert violations == []
    assert len(completed) == total and len(set(completed)) == total
    jobs = sched.list_jobs()
    assert len(jobs) == total and all(j.state is JobState.COMPLETED for j in jobs)
    assert sorted(j.created_seq for j in jobs) == list(range(1, total + 1))
    assert sorted(j.ready_seq or 0 for j in jobs) == list(range(1, total + 1))
    assert sched.counters()["by_state"]["completed"] == total
    sched.close()
