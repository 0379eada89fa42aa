"""What the workflow loops share: the tenant they work for, the services they call,
and where they record what happened.

The loops are coupled only through the Training Scheduler and the Training Queue
(paper §4.2); they reach the services through the protocols of
:mod:`joynexus.services.protocols`, which the service objects, the rollout-engine pool
and the Ray actor proxies all satisfy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from joynexus.control.admission import REFUSED_COMPLETION_TARGET
from joynexus.control.job import TaskType, TrainingJob
from joynexus.control.scheduler import TrainingScheduler
from joynexus.models.schema import DataSchema
from joynexus.services.protocols import (
    EnvironmentServiceAPI,
    InferenceModelServiceAPI,
    TrainingModelServiceAPI,
    TrainingQueueAPI,
)
from joynexus.services.tenancy import TenantConfig
from joynexus.spec.workload import WorkloadSpec
from joynexus.utils.clock import Clock
from joynexus.utils.storage import storage_full_cause

__all__ = [
    "ACTOR_ROLE",
    "ROLE_RESTARTED_REASON",
    "STORAGE_FULL_REASON",
    "MetricsLog",
    "WorkflowContext",
    "WorkflowTenant",
    "job_heartbeat",
]

ACTOR_ROLE = "actor"
ROLLOUT_ROLE = "rollout"
SFT_ROLE = "sft"

#: Terminal reason of the jobs in flight when the training role was restarted in place
#: (or found without the slots it held): the service's fault, never counted against the
#: workload.
ROLE_RESTARTED_REASON = "role_restarted"
#: Terminal reason of a job whose checkpoint could not be written (disk or quota full):
#: the slot was rolled back, the service's fault, never counted against the workload.
STORAGE_FULL_REASON = "storage_full"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Append-only JSONL metrics of one tenant (``<tenant output dir>/metrics.jsonl``)."""

    def __init__(self, path: Path | None, clock: Clock, *, resume: bool = False) -> None:
        self.path = path
        self.clock = clock
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            if resume and path.is_file():  # a restarted Master: what was recorded before
                for line in path.read_text().splitlines():
                    try:
                        self.records.append(json.loads(line))
                    except ValueError:  # a line cut short by a kill: skip it
                        continue

    def write(self, kind: str, **values: Any) -> None:
        record = {"kind": kind, "time": self.clock.wall()}
        record.update({k: _finite(v) for k, v in values.items()})
        with self._lock:
            self.records.append(record)
            if self.path is not None:
                try:
                    with self.path.open("a") as fh:
                        fh.write(json.dumps(record, sort_keys=True, default=str) + "\n")
                except OSError as error:
                    # A full disk must not turn the fault being reported into another
                    # one: the record stays in memory (status and metrics still show it).
                    if storage_full_cause(error) is None:
                        raise
                    log.warning("metrics of %s not written: %s", self.path, error)

    def of_kind(self, *kinds: str) -> list[dict[str, Any]]:
        """The records of any of ``kinds``, in the order written (one pass)."""
        with self._lock:
            return [r for r in self.records if r["kind"] in kinds]


@dataclass
class WorkflowTenant:
    """One tenant as the loops see it.

    Attributes:
        spec: Its workload spec.
        schema: Its resolved data schema.
        schema_signature: The signature the model services assigned to it.
        config: Its tenant config (None for an evaluation workload).
        session_id: Its Environment Service session (RL rollouts, evaluation).
        serve: Publish weights to inference after every update (RL tenants and
            evaluation targets).
        metrics: Its metrics log.
        workload_id: The Master workload it runs for (tags its jobs; None outside one).
        last_checkpoint_version: Version of its latest checkpoint.
        jobs_applied: Training jobs whose updates its current weights contain (the
            ledger recorded with every checkpoint).
        eval_first_run: The first evaluation run still to do (a resumed evaluation).
        fault: A service fault it is waiting out (its checkpoints cannot be written);
            None once it passed.
        rollbacks: How often its slot was rolled back to its last checkpoint (an update
            trained across a rollback is failed: :func:`~joynexus.workflows.commit.settle_behind`).
    """

    spec: WorkloadSpec
    schema: DataSchema
    schema_signature: str
    config: TenantConfig | None
    metrics: MetricsLog
    session_id: str | None = None
    serve: bool = True
    workload_id: str | None = None
    last_checkpoint_version: int = 0
    jobs_applied: int = 0
    eval_first_run: int = 0
    errors: list[str] = field(default_factory=list)
    fault: str | None = None
    rollbacks: int = 0

    def job_metadata(self) -> dict[str, Any]:
        """Metadata of the jobs its producer reserves (schema signature, workload)."""
        meta: dict[str, Any] = {"schema_signature": self.schema_signature}
        if self.workload_id is not None:
            meta["workload_id"] = self.workload_id
        return meta

    @property
    def tenant_id(self) -> str:
        return self.spec.tenant

    @property
    def task_type(self) -> TaskType | None:
        task = self.spec.task.value
        return TaskType(task) if task in ("rl", "sft") else None


@dataclass
class WorkflowContext:
    """The shared objects every loop of one runtime uses."""

    scheduler: TrainingScheduler
    queue: TrainingQueueAPI
    training: TrainingModelServiceAPI
    inference: InferenceModelServiceAPI
    clock: Clock
    tenants: Mapping[str, WorkflowTenant]
    #: Opens the extra sessions of an evaluation over several tasks (None: not hosted).
    env: EnvironmentServiceAPI | None = None
    domain: str = "vla"
    #: Back-off after a refused reservation or an empty stage (scheduler has no waiter
    #: for those transitions); short, and on the injected clock.
    poll_s: float = 0.05
    #: How long the actor parks on ``async_wait_for_ready`` before re-checking.
    ready_wait_s: float = 1.0
    #: Most ready jobs (of different tenants) the actor leases and trains together,
    #: sharing one grouped backbone forward per microbatch; 1 = one job at a time.
    actor_group_size: int = 4
    #: Checkpoint every update before it is published or its job completes (the
    #: Master's durability: a version is never issued twice, and completed jobs are
    #: exactly the updates in the weights); False: ``scheduling.checkpoint_every``.
    durable_checkpoints: bool = False
    #: Commit an SFT job's update (write the checkpoint, publish, complete) behind the
    #: tenant's next update instead of before it (:mod:`joynexus.workflows.commit`).
    overlap_updates: bool = False
    #: The commits running behind, by tenant (at most one each).
    commits_behind: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    #: Whether a job's update reached the tenant's latest checkpoint (its ledger names
    #: the job). A job that fails after that point — say the training role died while
    #: publishing — completes instead: its update is in the weights a restart restores,
    #: so completed jobs stay exactly the updates in the weights. None: never.
    in_checkpoint: Callable[[TrainingJob], bool] | None = None
    #: How long the actor waits for a live tenant's training slot to come back when the
    #: role answered without it (Ray re-created the role after its node was lost, and the
    #: Master's restart has not rebuilt the slots yet). A job caught in that window fails
    #: ``role_restarted`` — not the job's fault — when the slot returns within it, and
    #: with its own error (counted) when it does not. 0: never wait.
    slot_grace_s: float = 0.0
    #: Called with a tenant id before its checkpoint is written; raises
    #: ``StorageFullError`` when the tenant is past its disk quota (the write is then
    #: refused like one on a full disk). None: no quota.
    disk_check: Callable[[str], None] | None = None


def job_heartbeat(scheduler: TrainingScheduler, job: TrainingJob) -> Callable[[], None]:
    """A callback that keeps ``job``'s current lease alive."""

    def beat() -> None:
        scheduler.heartbeat(job.job_id, job.lease_epoch)

    return beat


def reason_of(error: BaseException) -> str:
    """A terminal reason for a failed job: the error's code or class, and message;
    ``cancelled`` for a cancellation (a shutdown, never the job's fault: the Master does
    not count it against the workload)."""
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    code = getattr(error, "code", None) or type(error).__name__
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{code}: {text}"[:500]


log = logging.getLogger(__name__)

#: A producer's back-off while the disk is full (its reservations cannot be recorded).
STORAGE_BACKOFF_S = 0.5


async def produce_until_target(
    ctx: WorkflowContext,
    tenant: WorkflowTenant,
    produce_once: Callable[[], Awaitable[str | None]],
    what: str,
) -> None:
    """Run a producer iteration after another until the completion target refuses it.

    ``produce_once`` returns ``None`` after producing a job, or the refusal reason. A
    refusal backs off for ``ctx.poll_s`` on the injected clock (capacity frees only when
    one of the tenant's jobs ends), never busy-looping; a failed iteration is recorded
    on the tenant and the loop goes on (one bad rollout or batch must not stop it).
    """
    shown: str | None = None  # the full-disk fault this loop shows on the tenant
    while True:
        try:
            refusal = await produce_once()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if (full := storage_full_cause(error)) is not None:
                # A full disk is the service's fault, not a bad batch: show it, wait
                # it out (no error per try), go on once a write succeeds again.
                if tenant.fault is None:
                    shown = tenant.fault = (
                        f"{what} jobs cannot be recorded: {full.reason}; training resumes "
                        "by itself once space is freed"
                    )
                    log.error("%s producer %s: %s", what, tenant.tenant_id, error)
                await ctx.clock.sleep(max(ctx.poll_s, STORAGE_BACKOFF_S))
                continue
            log.warning("%s producer %s: %s", what, tenant.tenant_id, error)
            tenant.errors.append(reason_of(error))
            await ctx.clock.sleep(ctx.poll_s)
            continue
        if shown is not None and tenant.fault == shown:
            tenant.fault = shown = None
        if refusal == REFUSED_COMPLETION_TARGET:
            return
        if refusal is not None:
            await ctx.clock.sleep(ctx.poll_s)
