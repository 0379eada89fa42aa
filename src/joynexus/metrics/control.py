"""Control signals: job states, queue depth, in-flight requests, policy staleness.

The paper's Master reads these for admission and resource management (§4.1.3). The
:class:`ControlSampler` reads them from the control plane when polled — the Training
Scheduler's counters, the Training Queue's partitions and bytes, the Inference Queue's
depth and the in-flight predicts — and emits them as ``control`` events:

* ``scheduler.jobs`` {state} per tenant (every job has a tenant: the service-wide
  count is their sum, ``sum by (state) (joynexus_control_scheduler_jobs)``, and is not
  emitted again next to them, which would count every job twice in such a sum),
* ``scheduler.refusals`` {reason} (admission refusals so far), service-wide,
* ``training_queue.bytes``, ``training_queue.partitions``, service-wide,
* ``inference_queue.depth``, ``inference_queue.in_flight``, service-wide,
* ``policy_staleness`` per tenant: the tenant's latest policy version minus the
  behaviour version of its oldest ready RL job (0 when it has none).

Service-wide events carry no tenant, and the Prometheus sink exposes them without a
``tenant`` label (:mod:`joynexus.metrics.prometheus`).

It imports no torch: the sampler can run next to the scheduler in a control process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict, Field

from joynexus.control.job import JobState, TaskType
from joynexus.errors import JoyNexusError
from joynexus.metrics.events import MetricsService
from joynexus.utils.clock import Clock, SystemClock

if TYPE_CHECKING:
    from joynexus.control.scheduler import TrainingScheduler
    from joynexus.queues.inference_metrics import InferenceQueueMetrics

__all__ = ["ControlSampler", "ControlSnapshot", "QueueGauge"]


class QueueGauge(Protocol):
    """What the sampler reads of a Training Queue (in process, or its Ray proxy)."""

    @property
    def nbytes(self) -> int: ...

    def partitions(self) -> Sequence[object]: ...


class ControlSnapshot(BaseModel):
    """What one :meth:`ControlSampler.poll` read (None: that source is not attached)."""

    model_config = ConfigDict(extra="forbid")

    jobs_by_state: dict[str, int] = Field(default_factory=dict)
    jobs_by_tenant: dict[str, dict[str, int]] = Field(default_factory=dict)
    refusals: dict[str, int] = Field(default_factory=dict)
    training_queue_bytes: int | None = None
    training_queue_partitions: int | None = None
    inference_queue_depth: int | None = None
    inference_in_flight: int | None = None
    policy_staleness: dict[str, int] = Field(default_factory=dict)


class ControlSampler:
    """Reads control-plane state and emits it as control events.

    Args:
        metrics: Where the events go.
        scheduler: The Training Scheduler (job states, refusals, ready RL jobs).
        training_queue: The Training Queue (bytes held, partitions).
        inference_metrics: Returns the Inference Queue's metrics (e.g.
            ``lambda: inference_service.metrics``).
        inference_in_flight: Returns the predicts accepted and not yet answered; when
            absent it is derived from the queue's counters.
        policy_version: ``tenant_id -> latest policy version`` (e.g. the Training Model
            Service's ``policy_version``); without it no staleness is reported.
    """

    def __init__(
        self,
        metrics: MetricsService,
        *,
        scheduler: TrainingScheduler | None = None,
        training_queue: QueueGauge | None = None,
        inference_metrics: Callable[[], InferenceQueueMetrics] | None = None,
        inference_in_flight: Callable[[], int] | None = None,
        policy_version: Callable[[str], int] | None = None,
    ) -> None:
        self.metrics = metrics
        self.scheduler = scheduler
        self.training_queue = training_queue
        self.inference_metrics = inference_metrics
        self.inference_in_flight = inference_in_flight
        self.policy_version = policy_version

    def poll(self) -> ControlSnapshot:
        """Read every attached source once and emit the control events."""
        snap = ControlSnapshot()
        if self.scheduler is not None:
            self._scheduler(snap, self.scheduler)
        if self.training_queue is not None:
            snap.training_queue_bytes = self.training_queue.nbytes
            snap.training_queue_partitions = len(self.training_queue.partitions())
            self._emit("training_queue.bytes", snap.training_queue_bytes)
            self._emit("training_queue.partitions", snap.training_queue_partitions)
        if self.inference_metrics is not None:
            m = self.inference_metrics()
            snap.inference_queue_depth = m.queue_depth
            if self.inference_in_flight is not None:
                snap.inference_in_flight = self.inference_in_flight()
            else:
                # Accepted minus resolved; clamped because a request cancelled while
                # running is not counted as resolved by the queue.
                resolved = m.completed + m.errors + m.timeouts + m.cancellations
                snap.inference_in_flight = max(0, m.requests - resolved)
            self._emit("inference_queue.depth", snap.inference_queue_depth)
            self._emit("inference_queue.in_flight", snap.inference_in_flight)
        return snap

    def _scheduler(self, snap: ControlSnapshot, scheduler: TrainingScheduler) -> None:
        counters = scheduler.counters()
        snap.jobs_by_state = dict(counters["by_state"])
        snap.jobs_by_tenant = {t: dict(c) for t, c in counters["by_tenant"].items()}
        snap.refusals = dict(scheduler.refusals())
        for tenant, counts in snap.jobs_by_tenant.items():
            for state in JobState:
                self._emit(
                    "scheduler.jobs", counts.get(state.value, 0), tenant, {"state": state.value}
                )
        for reason, n in snap.refusals.items():
            self._emit("scheduler.refusals", n, labels={"reason": reason})
        if self.policy_version is None:
            return
        for tenant in snap.jobs_by_tenant:
            staleness = self._staleness(scheduler, tenant)
            if staleness is not None:
                snap.policy_staleness[tenant] = staleness
                self._emit("policy_staleness", staleness, tenant)

    def _staleness(self, scheduler: TrainingScheduler, tenant: str) -> int | None:
        assert self.policy_version is not None
        try:
            latest = self.policy_version(tenant)
        except JoyNexusError:
            return None  # a tenant the trainer does not hold (e.g. already removed)
        ready = [
            j
            for j in scheduler.list_jobs(tenant, JobState.READY)
            if j.task_type == TaskType.RL and j.behavior_policy_version is not None
        ]
        if not ready:
            return 0
        oldest = min(ready, key=lambda j: (j.ready_seq or 0, j.created_seq))
        assert oldest.behavior_policy_version is not None
        return max(0, latest - oldest.behavior_policy_version)

    def _emit(
        self,
        name: str,
        value: float,
        tenant_id: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.metrics.emit_value("control", name, value, tenant_id=tenant_id, labels=labels)

    async def run(self, interval_s: float = 1.0, clock: Clock | None = None) -> None:
        """Poll every ``interval_s`` (run it as a task; cancel to stop)."""
        c: Clock = clock or SystemClock()
        while True:
            self.poll()
            await c.sleep(interval_s)
