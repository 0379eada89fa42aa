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

Fairness (§5.1: rollouts are admitted round-robin across tenants): when a global
bound is full, the tenants refused for it wait their turn, and the next free place
goes to the waiting tenant admitted longest ago — not to whichever asks first after
it frees (a tenant whose loop asks right after its own job finishes would otherwise
keep the place for ever). A tenant refused ``global_turn`` has capacity available but
another tenant is ahead of it. A :class:`GlobalLimit` can apply to some producer roles
only (``producer_roles``): the Master's bounds cover its own workloads' jobs, so
reservations a tenant makes by hand through the API neither count against them nor
can hold them (those are bounded per tenant by the server).
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
#: A place is free, but another tenant waiting for one was admitted longer ago.
REFUSED_GLOBAL_TURN = "global_turn"

REFUSAL_REASONS: tuple[str, ...] = (
    REFUSED_MAX_IN_FLIGHT,
    REFUSED_COMPLETION_TARGET,
    REFUSED_TARGET_IN_FLIGHT,
    REFUSED_GLOBAL_MAX_ACTIVE,
    REFUSED_GLOBAL_MAX_ACTIVE_PER_TENANT,
    REFUSED_GLOBAL_TURN,
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
        producer_roles: The bounds count and apply to jobs of these producer roles only
            (None: every job of the task type).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_type: TaskType
    max_active: int | None = Field(default=None, ge=0)
    max_active_per_tenant: int | None = Field(default=None, ge=0)
    producer_roles: frozenset[str] | None = None

    def covers(self, producer_role: str | None) -> bool:
        """Whether this bound applies to a job of ``producer_role``."""
        return self.producer_roles is None or producer_role in self.producer_roles


@dataclass(slots=True)
class AdmissionCounts:
    """The live counts admission decides on; the scheduler keeps them up to date."""

    in_flight: dict[tuple[str, TaskType], int] = field(default_factory=dict)
    completed: dict[tuple[str, TaskType], int] = field(default_factory=dict)
    active: dict[TaskType, int] = field(default_factory=dict)
    active_per_tenant: dict[tuple[str, TaskType], int] = field(default_factory=dict)
    # The same by producer role (limits with ``producer_roles``).
    active_by_role: dict[tuple[TaskType, str], int] = field(default_factory=dict)
    active_per_tenant_by_role: dict[tuple[str, TaskType, str], int] = field(default_factory=dict)

    def add_active(self, tenant_id: str, task_type: TaskType, role: str, delta: int) -> None:
        self.active[task_type] = self.active.get(task_type, 0) + delta
        key = (tenant_id, task_type)
        self.active_per_tenant[key] = self.active_per_tenant.get(key, 0) + delta
        rkey = (task_type, role)
        self.active_by_role[rkey] = self.active_by_role.get(rkey, 0) + delta
        tkey = (tenant_id, task_type, role)
        self.active_per_tenant_by_role[tkey] = self.active_per_tenant_by_role.get(tkey, 0) + delta

    def active_of(self, limit: GlobalLimit, tenant_id: str | None = None) -> int:
        """Active jobs ``limit`` counts (of one tenant, or of all)."""
        task = limit.task_type
        if limit.producer_roles is None:
            if tenant_id is None:
                return self.active.get(task, 0)
            return self.active_per_tenant.get((tenant_id, task), 0)
        if tenant_id is None:
            return sum(self.active_by_role.get((task, r), 0) for r in limit.producer_roles)
        return sum(
            self.active_per_tenant_by_role.get((tenant_id, task, r), 0)
            for r in limit.producer_roles
        )


def admission_refusal(
    tenant_id: str,
    task_type: TaskType,
    policy: AdmissionPolicy,
    limit: GlobalLimit | None,
    counts: AdmissionCounts,
    producer_role: str | None = None,
) -> str | None:
    """The reason a new ``tenant_id``/``task_type`` job would be refused, or None to admit."""
    if limit is not None and not limit.covers(producer_role):
        limit = None  # not a job this bound covers
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
        if limit.max_active is not None and counts.active_of(limit) >= limit.max_active:
            return REFUSED_GLOBAL_MAX_ACTIVE
        if (
            limit.max_active_per_tenant is not None
            and counts.active_of(limit, tenant_id) >= limit.max_active_per_tenant
        ):
            return REFUSED_GLOBAL_MAX_ACTIVE_PER_TENANT
    return None


class AdmissionTurns:
    """Round-robin over the tenants waiting for a place under a full global bound.

    A tenant refused ``global_max_active`` waits (while it asks again within
    ``ttl_s``); when a place frees, a tenant may take it only if no other waiting
    tenant was admitted less recently (never admitted counts as longest ago), else
    it is refused ``global_turn`` and waits too. Not thread-safe: the scheduler's lock
    guards it.
    """

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._waiting: dict[TaskType, dict[str, float]] = {}
        self._admitted: dict[TaskType, dict[str, int]] = {}
        self._order = 0

    def decide(
        self,
        limit: GlobalLimit,
        tenant_id: str,
        reason: str | None,
        counts: AdmissionCounts,
        now: float,
    ) -> str | None:
        """``reason`` (the bounds' verdict), or ``global_turn`` when it is another
        tenant's turn; records the admission when the result is None."""
        task = limit.task_type
        waiting = self._waiting.setdefault(task, {})
        for other, asked_at in list(waiting.items()):
            if now - asked_at > self.ttl_s:
                del waiting[other]  # stopped asking: it gives up its turn
        own_full = (
            limit.max_active_per_tenant is not None
            and counts.active_of(limit, tenant_id) >= limit.max_active_per_tenant
        )
        if reason is not None:
            if reason == REFUSED_GLOBAL_MAX_ACTIVE and not own_full:
                waiting[tenant_id] = now
            else:
                waiting.pop(tenant_id, None)  # refused for its own bounds: no turn to hold
            return reason
        admitted = self._admitted.setdefault(task, {})
        mine = admitted.get(tenant_id, -1)
        if any(admitted.get(other, -1) < mine for other in waiting if other != tenant_id):
            waiting[tenant_id] = now
            return REFUSED_GLOBAL_TURN
        waiting.pop(tenant_id, None)
        self._order += 1
        admitted[tenant_id] = self._order
        return None


_DEFAULT_POLICY = AdmissionPolicy()


class Admission:
    """The admission configuration and record of one scheduler.

    Policies and global limits (configuration, not stored), the refusal counters and
    the last refusal of each tenant–task pair, and the round-robin turns. Not
    thread-safe: the scheduler calls it under its lock.
    """

    def __init__(self, turn_ttl_s: float) -> None:
        self._policies: dict[tuple[str, TaskType], AdmissionPolicy] = {}
        self._limits: dict[TaskType, GlobalLimit] = {}
        self._refusals: dict[str, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        self._last_refusal: dict[tuple[str, TaskType], str] = {}
        self._turns = AdmissionTurns(turn_ttl_s)

    def set_policy(self, tenant_id: str, task_type: TaskType, policy: AdmissionPolicy) -> None:
        self._policies[(tenant_id, task_type)] = policy

    def set_global_limit(self, limit: GlobalLimit) -> None:
        self._limits[limit.task_type] = limit

    def refusals(self) -> dict[str, int]:
        return dict(self._refusals)

    def last_refusal(self, tenant_id: str, task_type: TaskType) -> str | None:
        return self._last_refusal.get((tenant_id, task_type))

    def admit(
        self,
        tenant_id: str,
        task_type: TaskType,
        producer_role: str,
        counts: AdmissionCounts,
        now: float,
    ) -> AdmissionPolicy | None:
        """The pair's policy if a new job is admitted; None (refusal recorded) if not."""
        key = (tenant_id, task_type)
        policy = self._policies.get(key, _DEFAULT_POLICY)
        limit = self._limits.get(task_type)
        reason = admission_refusal(tenant_id, task_type, policy, limit, counts, producer_role)
        if limit is not None and limit.max_active is not None and limit.covers(producer_role):
            reason = self._turns.decide(limit, tenant_id, reason, counts, now)
        if reason is None:
            return policy
        self._refusals[reason] = self._refusals.get(reason, 0) + 1
        self._last_refusal[key] = reason
        return None
