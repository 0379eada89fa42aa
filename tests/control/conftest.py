"""Shared helpers for the Training Scheduler tests."""

from __future__ import annotations

from typing import Any

import pytest

from joynexus.control.job import JobState, TaskType, TrainingJob
from joynexus.control.scheduler import TrainingScheduler
from joynexus.utils.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sched(clock: FakeClock) -> TrainingScheduler:
    return TrainingScheduler.in_memory(clock=clock, lease_ttl_s=10.0, max_attempts=3)


def reserve(
    sched: TrainingScheduler,
    tenant: str = "t1",
    task: TaskType | str = TaskType.SFT,
    **kw: Any,
) -> TrainingJob:
    """Reserve one job with paper-like defaults; fails the test if it is refused."""
    args: dict[str, Any] = dict(
        policy_key=f"{tenant}/{task}",
        domain="vla",
        tenant_id=tenant,
        task_type=task,
        sample_count=16,
        producer_role="rollout" if TaskType(task) is TaskType.RL else "sft",
        consumer_role="actor",
        metadata={"schema_signature": "sig-a"},
    )
    args.update(kw)
    job = sched.reserve(**args)
    assert job is not None, sched.refusals()
    return job


def make_ready(sched: TrainingScheduler, job: TrainingJob) -> TrainingJob:
    """Drive a reserved job through its producer-side stages to ``ready``."""
    if job.task_type is TaskType.SFT:
        return sched.mark(job.job_id, JobState.READY, lease_epoch=job.lease_epoch)
    sched.mark(job.job_id, JobState.NEEDS_ADVANTAGES, lease_epoch=job.lease_epoch)
    staged = sched.lease_stage(
        JobState.NEEDS_ADVANTAGES, job.consumer_role, job.domain, JobState.COMPUTING_ADVANTAGES
    )
    assert staged is not None and staged.job_id == job.job_id
    return sched.mark(job.job_id, JobState.READY, lease_epoch=staged.lease_epoch)
