"""The Master's workload records and the book that keeps them (persistence, events).

:class:`WorkloadBook` is the one place that knows the live workloads, the tenants'
slots and where each workload's files go; every part of the Master (lifecycle,
supervision, recovery, reporting, the model primitives) reads and writes through it.
Ownership of a workload id is answered here with the one rule of
:func:`joynexus.errors.unknown_id`: another tenant's workload is an unknown one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from joynexus.api import WorkloadState
from joynexus.control.admission import AdmissionPolicy
from joynexus.control.job import JobTally, TrainingJob
from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import StorageFullError, unknown_id
from joynexus.master.store import WorkloadRecord, WorkloadStore
from joynexus.models.backbone import ResidentBaseModel
from joynexus.spec.workload import TaskKind
from joynexus.utils.clock import Clock
from joynexus.workflows.compile import CompiledWorkload
from joynexus.workflows.context import (
    ROLE_RESTARTED_REASON,
    STORAGE_FULL_REASON,
    MetricsLog,
    WorkflowTenant,
)
from joynexus.workflows.sft import SFTSource

__all__ = [
    "CANCELLED_REASON",
    "RESTARTED_REASON",
    "TRAINABLE",
    "Workload",
    "WorkloadBook",
]

#: Terminal reason of the jobs a cancelled workload leaves in flight.
CANCELLED_REASON = "cancelled"
#: Terminal reason of the jobs a previous process left in flight (not the job's fault).
RESTARTED_REASON = "runtime_restarted"
#: Failures that are the service's, not the workload's: they never count against it.
NOT_THE_JOBS_FAULT = (
    CANCELLED_REASON,
    RESTARTED_REASON,
    ROLE_RESTARTED_REASON,
    STORAGE_FULL_REASON,
)
TRAINABLE = (TaskKind.RL, TaskKind.SFT, TaskKind.CUSTOM)

log = logging.getLogger(__name__)


@dataclass
class Workload:
    workload_id: str
    compiled: CompiledWorkload
    created_at: float
    seq: int
    state: WorkloadState = WorkloadState.STARTING
    tenant: WorkflowTenant | None = None
    admission: AdmissionPolicy | None = None
    completed_before: int | None = None
    producer: asyncio.Task[Any] | None = None
    supervisor: asyncio.Task[None] | None = None
    finished_at: float | None = None
    error: str | None = None
    eval_runs: int = 0
    restarts: int = 0
    #: Resume into ``paused`` (a paused workload recovered after a restart).
    resume_paused: bool = False
    final_version: int | None = None
    source: SFTSource | None = None
    heldout_initial: float | None = None
    #: Watchdog: the progress last seen and when it changed (clock.now()).
    progress_mark: tuple[int, int, int] = (0, 0, 0)
    progress_at: float = 0.0
    stalled: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tenant_id(self) -> str:
        return self.compiled.tenant_id

    @property
    def task(self) -> TaskKind:
        return self.compiled.task

    def record(self) -> WorkloadRecord:
        # A paused workload being recovered is 'starting' here but stays paused on disk:
        # a second restart before it settled must not resume it.
        paused = self.state is WorkloadState.STARTING and self.resume_paused
        return WorkloadRecord(
            workload_id=self.workload_id,
            tenant_id=self.tenant_id,
            seq=self.seq,
            spec=self.compiled.spec.model_dump(mode="json", by_alias=True),
            state=WorkloadState.PAUSED if paused else self.state,
            created_at=self.created_at,
            finished_at=self.finished_at,
            completed_before=self.completed_before,
            eval_runs=self.eval_runs,
            error=self.error,
            restarts=self.restarts,
            final_version=self.final_version,
        )


class WorkloadBook:
    """Workloads, tenant slots and their files; every state change is saved here.

    Args:
        base: The resident base model (its schema signatures go in manifests).
        base_model_id: Its id as specs name it.
        scheduler: Where the workloads' jobs are (tagged with the workload id).
        store: Where workload records are kept.
        output_root: Tenant output dirs are ``<output_root>/<tenant>``.
        clock: Time source of records and events.
    """

    def __init__(
        self,
        *,
        base: ResidentBaseModel,
        base_model_id: str,
        scheduler: TrainingScheduler,
        store: WorkloadStore,
        output_root: Path,
        clock: Clock,
    ) -> None:
        self.base = base
        self.base_model_id = base_model_id
        self.scheduler = scheduler
        self.store = store
        self.output_root = output_root
        self.clock = clock
        self.tenants: dict[str, WorkflowTenant] = {}  # trainable tenants with a slot
        self.workloads: dict[str, Workload] = {}
        self.seq = itertools.count(1)
        #: Workloads whose latest record a full disk kept out of the store (see save).
        self.unsaved: set[str] = set()

    # ------------------------------------------------------------------ lookups

    def owned(self, tenant_id: str, workload_id: str) -> Workload:
        """The tenant's workload; another tenant's answers as an unknown id."""
        w = self.workloads.get(workload_id)
        if w is None or w.tenant_id != tenant_id:
            raise unknown_id("workload", workload_id)
        return w

    def live(self) -> list[Workload]:
        return [w for w in self.workloads.values() if not w.state.is_terminal]

    def jobs_of(self, w: Workload) -> list[TrainingJob]:
        """The jobs this workload's producer reserved (tagged with its id)."""
        return [
            j
            for j in self.scheduler.list_jobs(tenant_id=w.tenant_id)
            if j.metadata.get("workload_id") == w.workload_id
        ]

    def tally(self, w: Workload) -> JobTally:
        """Counts over :meth:`jobs_of` without a snapshot per job (polled often)."""
        return self.scheduler.tally(w.tenant_id, w.workload_id)

    def in_flight(self, w: Workload) -> int:
        return self.tally(w).in_flight

    def failed(self, w: Workload) -> int:
        """Failed jobs that count against the workload (not restarts or cancels)."""
        return self.tally(w).failed_except(NOT_THE_JOBS_FAULT)

    def holds_slot(self, w: Workload) -> bool:
        """``w`` is the workload whose tenant state the tenant's slot holds now."""
        return w.tenant is not None and self.tenants.get(w.tenant_id) is w.tenant

    # -------------------------------------------------------------------- files

    def tenant_dir(self, tenant_id: str) -> Path:
        """The tenant's output directory (checkpoints, workload folders)."""
        return self.output_root / tenant_id

    def workload_dir(self, w: Workload) -> Path:
        return self.tenant_dir(w.tenant_id) / "workloads" / w.workload_id

    def metrics_log(self, w: Workload) -> MetricsLog:
        return MetricsLog(self.workload_dir(w) / "metrics.jsonl", self.clock, resume=True)

    def write_manifest(self, w: Workload) -> None:
        folder = self.workload_dir(w)
        folder.mkdir(parents=True, exist_ok=True)
        manifest = {
            "workload_id": w.workload_id,
            "tenant_id": w.tenant_id,
            "task": w.task.value,
            "created_at": w.created_at,
            "base_model": self.base_model_id,
            "schema_signature": self.base.signature_for(w.compiled.schema),
            "spec": w.compiled.spec.model_dump(mode="json", by_alias=True),
        }
        (folder / "workload.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))

    def save(self, w: Workload, *, defer_if_full: bool = False) -> None:
        """Commit ``w``'s record (every state change goes through here).

        Args:
            defer_if_full: On a full disk, keep the record in memory and commit it at
                a later :meth:`flush` (what the supervisors ask for: a workload must
                not fail because its state could not be written for a while).

        Raises:
            StorageFullError: the disk is full (and the save was not deferred).
        """
        if w.state.is_terminal and w.final_version is None and self.holds_slot(w):
            assert w.tenant is not None
            w.final_version = w.tenant.last_checkpoint_version
        try:
            self.store.put(w.record())
        except StorageFullError as error:
            if not defer_if_full:
                raise
            if w.workload_id not in self.unsaved:
                log.error("workload %s: record deferred: %s", w.workload_id, error.message)
            self.unsaved.add(w.workload_id)
            return
        self.unsaved.discard(w.workload_id)

    def flush(self) -> None:
        """Commit the records a full disk deferred (:meth:`save`); the rest wait on."""
        for wid in sorted(self.unsaved):
            w = self.workloads.get(wid)
            if w is None:
                self.unsaved.discard(wid)
            else:
                self.save(w, defer_if_full=True)

    def write_event(self, w: Workload, state: str, **extra: Any) -> None:
        with contextlib.suppress(OSError):
            MetricsLog(self.workload_dir(w) / "metrics.jsonl", self.clock).write(
                "lifecycle", state=state, **extra
            )
