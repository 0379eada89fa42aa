"""Admission control for training-job reservations (paper §4.3, Appendix A.2, A.4).

Two layers decide whether ``reserve`` admits a job:

* an :class:`AdmissionPolicy` per tenant–task pair: the priority copied onto its
  jobs, a bound on in-flight (non-terminal) jobs, and an optional completion target;
* a :class:`GlobalLimit` per task type: how many jobs of that type may be *active*
  (state ``reserved``: the rollout or batch is still being produced) across all
  tenants and per tenant — the "active rollouts ≤ 3 globally and ≤ 1 per tenant"
  knob of §5.1.

Without admission control, offline data that is available at once would fill the
Training Queue faster than online rollouts are produced; the in-flight bound is
what prevents that crowding out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from joynexus.control.job import TaskType

# Refusal reasons, as recorded by the scheduler (stable strings: monitoring keys).
REFUSED_MAX_IN_FLIGHT = "max_in_flight"
REFUSED_COMPLETION_TARGET = "completion_target_reached"
#: The jobs in flight would reach the target if they all complete: wait for them (a
#: failed one frees its place), so the weights end with exactly the target's updates.
REFUSED_TARGET_IN_FLIGHT = "completion_target_in_flight"
REFUSED_GLOBAL_MAX_ACTIVE = "global_max_active"
REFUSED_GLOBAL_MAX_ACTIVE_PER_TENANT = "global_max_active_per_tenant"

REFUSAL_REASONS: tuple[str, ...] = (
    REFUSED_MAX_IN_FLIGHT,
    REFUSED_COMPLETION_TARGET,
    REFUSED_TARGET_IN_FLIGHT,
    REFUSED_GLOBAL_MAX_ACTIVE,
    REFUSED_GLOBAL_MAX_ACTIVE_PER_TENANT,
)


class AdmissionPolicy(BaseModel):
    """Admission rules of one tenant–task pair.

    Attributes:
        priority: Copied onto each admitted job; ``lease_next`` serves higher first.
        max_in_flight: Most non-terminal jobs this pair may have at once (None: no bound).
        completion_target: Once this many of the pair's jobs have completed, further
            reservations are refused (None: no target). Jobs in flight count toward
            it: while completed + in flight reach it, reservations wait
            (``completion_target_in_flight``), so exactly this many complete.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Bounded: the priority is stored with every job (SQLite INTEGER is 64-bit).
    priority: int = Field(default=0, ge=-(2**53 - 1), le=2**53 - 1)
    max_in_flight: int | None = Field(default=None, ge=0)
    completion_target: int | None = Field(default=None, ge=0)


class GlobalLimit(BaseModel):
    """Bounds on *active* jobs (state ``reserved``) of one task type.

    Attributes:
        task_type: The task type the bounds apply to.
        max_active: Most active jobs across all tenants (None: no bound).
        max_active_per_tenant: Most active jobs of any single tenant (None: no bound).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_type: TaskType
    max_active: int | None = Field(default=None, ge=0)
    max_active_per_tenant: int | None = Field(default=None, ge=0)


@dataclass(slots=True)
class AdmissionCounts:
    """The live counts admission decides on; the scheduler keeps them up to date."""

    in_flight: dict[tuple[str, TaskType], int] = field(default_factory=dict)
    completed: dict[tuple[str, TaskType], int] = field(default_factory=dict)
    active: dict[TaskType, int] = field(default_factory=dict)
    active_per_tenant: dict[tuple[str, TaskType], int] = field(default_factory=dict)


def admission_refusal(
    tenant_id: str,
    task_type: TaskType,
    policy: AdmissionPolicy,
    limit: GlobalLimit | None,
    counts: AdmissionCounts,
) -> str | None:
    """The reason a new ``tenant_id``/``task_type`` job would be refused, or None to admit."""
    key = (tenant_id, task_type)
    if policy.max_in_flight is not None and counts.in_flight.get(key, 0) >= policy.max_in_flight:
        return REFUSED_MAX_IN_FLIGHT
    if policy.completion_target is not None:
        completed = counts.completed.get(key, 0)
        if completed >= policy.completion_target:
            return REFUSED_COMPLETION_TARGET
        if completed + counts.in_flight.get(key, 0) >= policy.completion_target:
            return REFUSED_TARGET_IN_FLIGHT
    if limit is not None:
        if limit.max_active is not None and counts.active.get(task_type, 0) >= limit.max_active:
            return REFUSED_GLOBAL_MAX_ACTIVE
        if (
            limit.max_active_per_tenant is not None
            and counts.active_per_tenant.get(key, 0) >= limit.max_active_per_tenant
        ):
            return REFUSED_GLOBAL_MAX_ACTIVE_PER_TENANT
    return None
