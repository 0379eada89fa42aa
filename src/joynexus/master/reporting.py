"""What the Master reports: workload status, specs, metrics records, artifacts, and
what the Health Manager asks (live sessions, stalled workloads)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from joynexus.api import WorkloadMetrics, WorkloadStatus
from joynexus.master.records import NOT_THE_JOBS_FAULT, Workload, WorkloadBook
from joynexus.spec.workload import TaskKind
from joynexus.workflows.context import WorkflowTenant

__all__ = ["Reporter"]


class Reporter:
    """Read-only views of the workloads in a :class:`WorkloadBook`."""

    def __init__(self, book: WorkloadBook) -> None:
        self.book = book

    def session_holders(self) -> list[WorkflowTenant]:
        """The tenants of the live workloads (whose sessions the Health Manager watches)."""
        return [w.tenant for w in self.book.live() if w.tenant is not None]

    def degraded(self) -> list[str]:
        """Why the service is not fully healthy: stalled workloads (empty when fine)."""
        return [f"workload {w.workload_id}: {w.stalled}" for w in self.book.live() if w.stalled]

    def workload_ids(self) -> list[str]:
        """Every workload, oldest first (operators and ``joynexus run``)."""
        return list(self.book.workloads)

    def tenant_owner(self, workload_id: str) -> str | None:
        """The tenant a workload belongs to (None: no such workload)."""
        w = self.book.workloads.get(workload_id)
        return None if w is None else w.tenant_id

    def tenant_of(self, workload_id: str) -> WorkflowTenant | None:
        """The tenant as the loops see it (None before the workload started)."""
        w = self.book.workloads.get(workload_id)
        return None if w is None else w.tenant

    def list_workloads(self, tenant_id: str) -> list[WorkloadStatus]:
        """The tenant's workloads, oldest first."""
        return [
            self.status(tenant_id, wid)
            for wid, w in self.book.workloads.items()
            if w.tenant_id == tenant_id
        ]

    def status(self, tenant_id: str, workload_id: str) -> WorkloadStatus:
        """State and progress (jobs completed/target, version) of one workload."""
        w = self.book.owned(tenant_id, workload_id)
        c = w.compiled
        out = WorkloadStatus(
            workload_id=w.workload_id,
            tenant_id=w.tenant_id,
            task=c.task.value,
            state=w.state,
            created_at=w.created_at,
            finished_at=w.finished_at,
            schema_signature=w.tenant.schema_signature if w.tenant else None,
            session_id=w.tenant.session_id if w.tenant else None,
            error=w.error,
            restarts=w.restarts,
            stalled=w.stalled,
            fault=self._fault(w),
        )
        if c.task is TaskKind.EVAL:
            ev = c.spec.evaluation
            assert ev is not None
            out.eval_runs_target = ev.runs * len(ev.targets)
            out.eval_runs_completed = w.eval_runs or (
                len(w.tenant.metrics.of_kind("eval")) if w.tenant else 0
            )
            return out
        if w.final_version is not None:  # ended: the version it ended with
            out.policy_version = w.final_version
        elif self.book.holds_slot(w):
            assert w.tenant is not None
            # The durable version (checkpointed, hence the only one ever served): the
            # optimizer steps of a job still training would be lost by a crash, so a
            # version shown here never goes back across a restart.
            out.policy_version = w.tenant.last_checkpoint_version
        if c.task_type is not None:
            tally = self.book.tally(w)
            out.jobs_completed = tally.completed
            # Restarts and cancels are not failures.
            out.jobs_failed = tally.failed_except(NOT_THE_JOBS_FAULT)
            out.jobs_dropped = tally.dropped
            out.jobs_in_flight = tally.in_flight
            out.jobs_target = c.spec.scheduling.completion_target
        return out

    def _fault(self, w: Workload) -> str | None:
        """The service fault ``w`` waits out (a full disk), or None."""
        if w.state.is_terminal:
            return None
        if w.tenant is not None and w.tenant.fault is not None:
            return w.tenant.fault
        if w.workload_id in self.book.unsaved:
            return (
                "the workload's record cannot be written (disk full); it is kept in "
                "memory and written once space is freed"
            )
        return None

    def spec_of(self, tenant_id: str, workload_id: str) -> dict[str, Any]:
        """The compiled spec of a workload, as JSON data."""
        w = self.book.owned(tenant_id, workload_id)
        spec: dict[str, Any] = w.compiled.spec.model_dump(
            mode="json", by_alias=True, exclude={"output_dir"}
        )
        return spec

    def metrics(
        self, tenant_id: str, workload_id: str, kind: str | None = None, limit: int = 10_000
    ) -> WorkloadMetrics:
        """The workload's metrics records (newest ``limit``) and a per-kind summary."""
        w = self.book.owned(tenant_id, workload_id)
        path = self.book.workload_dir(w) / "metrics.jsonl"
        records: list[dict[str, Any]] = []
        if path.is_file():
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    records.append(json.loads(line))
        summary: dict[str, dict[str, Any]] = {}
        for r in records:
            entry = summary.setdefault(str(r.get("kind")), {"count": 0})
            entry["count"] += 1
            entry["last"] = r
        if kind is not None:
            records = [r for r in records if r.get("kind") == kind]
        return WorkloadMetrics(workload_id=workload_id, records=records[-limit:], summary=summary)

    def artifact_root(self, tenant_id: str, workload_id: str) -> Path:
        """Where a workload's artifacts live: its tenant's output directory."""
        self.book.owned(tenant_id, workload_id)
        return self.book.tenant_dir(tenant_id)
