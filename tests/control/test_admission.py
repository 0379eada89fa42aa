"""Admission: per tenant–task policies and global limits on active jobs."""

from __future__ import annotations

import pytest

from joynexus.control.admission import (
    REFUSED_COMPLETION_TARGET,
    REFUSED_GLOBAL_MAX_ACTIVE,
    REFUSED_GLOBAL_MAX_ACTIVE_PER_TENANT,
    REFUSED_MAX_IN_FLIGHT,
    REFUSED_TARGET_IN_FLIGHT,
    AdmissionPolicy,
    GlobalLimit,
)
from joynexus.control.job import TaskType
from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import InvalidRequestError
from joynexus.utils.clock import FakeClock

from .conftest import make_ready, reserve


def _try(sched: TrainingScheduler, tenant: str, task: str = "sft") -> bool:
    return (
        sched.reserve(
            policy_key="p",
            domain="vla",
            tenant_id=tenant,
            task_type=task,
            sample_count=4,
            producer_role="p",
            consumer_role="actor",
        )
        is not None
    )


def _finish(sched: TrainingScheduler, job_id: str) -> None:
    job = make_ready(sched, sched.get(job_id))
    leased = sched.lease_next("actor", ["vla"])
    assert leased is not None and leased.job_id == job.job_id
    sched.complete(leased.job_id, leased.lease_epoch)


def test_default_policy_admits_everything(sched: TrainingScheduler) -> None:
    assert all(_try(sched, "t1") for _ in range(20))
    assert sched.refusals() == dict.fromkeys(sched.refusals(), 0)
    assert sched.last_refusal("t1", "sft") is None


def test_max_in_flight_counts_nonterminal_jobs_per_tenant_task(sched: TrainingScheduler) -> None:
    sched.set_policy("t1", TaskType.SFT, AdmissionPolicy(max_in_flight=2))
    a = reserve(sched, "t1", "sft")
    reserve(sched, "t1", "sft")
    assert not _try(sched, "t1", "sft")
    assert sched.last_refusal("t1", "sft") == REFUSED_MAX_IN_FLIGHT
    assert sched.refusals()[REFUSED_MAX_IN_FLIGHT] == 1
    # other tenants and other task types of the same tenant are not bound by it
    assert _try(sched, "t2", "sft") and _try(sched, "t1", "rl")
    # a job that moves on but is not terminal still counts ...
    sched.mark(a.job_id, "ready")
    assert not _try(sched, "t1", "sft")
    # ... a terminal one frees the slot
    sched.fail(a.job_id, "bad batch")
    assert _try(sched, "t1", "sft")
    assert sched.refusals()[REFUSED_MAX_IN_FLIGHT] == 2


def test_completion_target_refuses_once_reached(sched: TrainingScheduler) -> None:
    sched.set_policy("t1", "sft", AdmissionPolicy(completion_target=2, priority=4))
    first = reserve(sched, "t1", "sft")
    assert first.priority == 4
    _finish(sched, first.job_id)
    failed = reserve(sched, "t1", "sft")
    # in flight counts toward the target: one more would overshoot it if both completed
    assert not _try(sched, "t1", "sft")
    assert sched.last_refusal("t1", "sft") == REFUSED_TARGET_IN_FLIGHT
    sched.fail(failed.job_id, "oops")  # failures do not count, and free their place
    second = reserve(sched, "t1", "sft")
    _finish(sched, second.job_id)
    assert not _try(sched, "t1", "sft")
    assert sched.last_refusal("t1", "sft") == REFUSED_COMPLETION_TARGET
    assert _try(sched, "t2", "sft")


def test_global_limits_bound_active_reserved_jobs(sched: TrainingScheduler) -> None:
    # the §5.1 setting: at most 3 active rollouts overall and 1 per tenant
    sched.set_global_limit(GlobalLimit(task_type="rl", max_active=3, max_active_per_tenant=1))
    a = reserve(sched, "a", "rl")
    assert not _try(sched, "a", "rl")
    assert sched.last_refusal("a", "rl") == REFUSED_GLOBAL_MAX_ACTIVE_PER_TENANT
    reserve(sched, "b", "rl")
    reserve(sched, "c", "rl")
    assert not _try(sched, "d", "rl")
    assert sched.last_refusal("d", "rl") == REFUSED_GLOBAL_MAX_ACTIVE
    assert _try(sched, "d", "sft")  # SFT has no limit set
    # once a's rollout is written it is no longer active, even though in flight
    sched.mark(a.job_id, "needs_advantages")
    assert _try(sched, "d", "rl")
    assert not _try(sched, "e", "rl")
    counts = sched.refusals()
    assert counts[REFUSED_GLOBAL_MAX_ACTIVE] == 2
    assert counts[REFUSED_GLOBAL_MAX_ACTIVE_PER_TENANT] == 1


def test_handed_off_and_lost_producers_stop_being_active(
    sched: TrainingScheduler, clock: FakeClock
) -> None:
    sched.set_global_limit(GlobalLimit(task_type="rl", max_active=1))
    a = reserve(sched, "a", "rl")
    assert not _try(sched, "b", "rl")
    sched.hand_off(a.job_id, a.lease_epoch)
    b = reserve(sched, "b", "rl")
    assert not _try(sched, "c", "rl")
    clock.advance(11.0)  # b's producer never heartbeats
    assert _try(sched, "c", "rl")
    assert sched.get(b.job_id).terminal_reason == "producer_lost"


def test_policy_and_limit_validation(sched: TrainingScheduler) -> None:
    with pytest.raises(ValueError):
        AdmissionPolicy(max_in_flight=-1)
    with pytest.raises(ValueError):
        AdmissionPolicy(unknown=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        GlobalLimit(task_type="eval")
    with pytest.raises(InvalidRequestError, match="task_type"):
        sched.set_policy("t1", "eval", AdmissionPolicy())
    with pytest.raises(InvalidRequestError, match="sample_count"):
        reserve(sched, sample_count=-1)
    with pytest.raises(InvalidRequestError, match="JSON"):
        reserve(sched, metadata={"x": object()})


def test_max_in_flight_zero_pauses_a_tenant(sched: TrainingScheduler) -> None:
    sched.set_policy("t1", "rl", AdmissionPolicy(max_in_flight=0))
    assert not _try(sched, "t1", "rl")
    sched.set_policy("t1", "rl", AdmissionPolicy())
    assert _try(sched, "t1", "rl")
    assert sched.last_refusal("t1", "rl") == REFUSED_MAX_IN_FLIGHT  # last one is kept
