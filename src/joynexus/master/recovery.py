"""Recovery: what a restart (of the process, or of the training role) brings back.

The one reader of the checkpoint ledger in the Master. Every update is checkpointed
*before* it is published or its job completes, with a ledger naming the job
(``WorkflowContext.durable_checkpoints``), so :meth:`Recovery.start` on the same run
directory brings everything back by itself:

1. jobs left in flight are reconciled with the checkpoints: the one whose update
   reached its tenant's latest checkpoint completes; the others fail
   ``runtime_restarted`` (their partitions lived in the dead process) and the
   producers reserve new ones;
2. every workload that was running continues from its tenant's latest checkpoint (so
   a version number is never issued for two different weights and never goes back,
   and the completed jobs are exactly the updates in the weights); paused ones come
   back paused; ended ones stay ended, and the last policy of each tenant is served
   again.

:meth:`Recovery.restart_training` is the training role's in-place restart: every live
tenant's slot is rebuilt from its latest checkpoint and its ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

from joynexus.api import WorkloadState
from joynexus.control.job import TrainingJob
from joynexus.errors import JoyNexusError, NotFoundError
from joynexus.master.compiler import SpecCompiler
from joynexus.master.records import RESTARTED_REASON, TRAINABLE, Workload, WorkloadBook
from joynexus.master.store import WorkloadRecord
from joynexus.master.supervision import Supervisor
from joynexus.models.checkpoints.payload import find_latest_checkpoint, read_manifest
from joynexus.spec.workload import TaskKind, WorkloadSpec
from joynexus.workflows import launch
from joynexus.workflows.actor import settle_committed
from joynexus.workflows.commit import publish
from joynexus.workflows.context import ROLE_RESTARTED_REASON

__all__ = ["Recovery"]

log = logging.getLogger(__name__)


class Recovery:
    """Brings stored workloads and in-flight jobs back (see module docstring)."""

    def __init__(self, book: WorkloadBook, compiler: SpecCompiler, supervisor: Supervisor):
        self.book = book
        self.compiler = compiler
        self.supervisor = supervisor
        self._training_lock = asyncio.Lock()

    def in_checkpoint(self, job: TrainingJob) -> bool:
        """Whether ``job``'s update is in its tenant's latest checkpoint (the ledger)."""
        latest = find_latest_checkpoint(self.book.output_root, job.tenant_id)
        if latest is None:
            return False
        try:
            return read_manifest(latest).ledger.get("job_id") == job.job_id
        except JoyNexusError:
            return False

    def jobs_applied(self, tenant_id: str) -> int:
        """How many jobs the tenant's latest checkpoint holds (its ledger's count)."""
        ledger = self.supervisor.training.checkpoint_ledger(tenant_id)
        return int(ledger.get("jobs_applied", 0))

    async def start(self) -> None:
        """Reconcile the jobs in flight, then resume the stored workloads."""
        self._reconcile_jobs()
        await self._recover()

    def _reconcile_jobs(self) -> None:
        """Settle the jobs a previous process left in flight against the checkpoints."""
        for job in self.book.scheduler.list_jobs():
            if job.is_terminal:
                continue
            if settle_committed(self.supervisor.ctx, job):
                # Its update reached the weights; only ``complete`` was lost.
                log.info("recovered job %s: its update is in the checkpoint", job.job_id)
            else:
                with contextlib.suppress(JoyNexusError):
                    self.book.scheduler.fail(job.job_id, RESTARTED_REASON)

    async def _recover(self) -> None:
        book = self.book
        records = book.store.load()
        book.seq = itertools.count(max((r.seq for r in records), default=0) + 1)
        served_again: set[str] = set()
        for r in records:
            w = self._restore_record(r)
            if w is None:
                continue
            book.workloads[w.workload_id] = w
            if not w.state.is_terminal:
                w.restarts += 1
                w.resume_paused = w.state is WorkloadState.PAUSED
                w.state = WorkloadState.STARTING
                book.save(w)
                book.write_event(w, "resumed_after_restart", restarts=w.restarts)
                self.supervisor.start(w)
                if w.task in TRAINABLE:
                    served_again.add(w.tenant_id)
        # Tenants whose last trainable workload ended keep serving their last policy.
        ended = [
            w
            for w in reversed(list(book.workloads.values()))
            if w.task in (TaskKind.RL, TaskKind.SFT) and w.state is WorkloadState.COMPLETED
        ]
        for w in ended:
            if w.tenant_id in served_again:
                continue
            served_again.add(w.tenant_id)
            try:
                await self._serve_ended(w)
            except Exception as exc:  # its policy stays unservable; others go on
                log.warning("could not serve %s's last policy again: %s", w.tenant_id, exc)

    def _restore_record(self, r: WorkloadRecord) -> Workload | None:
        try:
            spec = WorkloadSpec.model_validate(r.spec)
        except Exception as exc:  # a record this version cannot read: skip it loudly
            log.error("workload record %s is unreadable and skipped: %s", r.workload_id, exc)
            return None
        state, error = r.state, r.error
        try:
            compiled = self.compiler.compile(spec, r.tenant_id)
        except JoyNexusError as exc:  # e.g. the server's limits changed under it
            try:  # the same spec without this server's limits, to report on it
                compiled = self.compiler.compile_for_report(spec, r.tenant_id)
            except JoyNexusError:
                log.error("workload %s cannot be resumed and is skipped: %s", r.workload_id, exc)
                return None
            if not state.is_terminal:
                state = WorkloadState.FAILED
                error = f"cannot resume after a restart: {str(exc).splitlines()[0]}"[:500]
        w = Workload(r.workload_id, compiled, r.created_at, r.seq, state=state)
        w.finished_at = r.finished_at
        w.completed_before = r.completed_before
        w.final_version = r.final_version
        w.eval_runs = r.eval_runs
        w.error = error
        w.restarts = r.restarts
        w.progress_at = self.book.clock.now()
        if state is not r.state:
            w.finished_at = self.book.clock.wall()
            self.book.save(w)
        return w

    async def _serve_ended(self, w: Workload) -> None:
        """Give an ended trainable workload's tenant its slot back (restored, served)."""
        sup = self.supervisor
        started = await launch.start_tenant(
            w.compiled,
            base=sup.base,
            training=sup.training,
            inference=sup.inference,
            metrics=self.book.metrics_log(w),
            session_id=None,
            serve=True,
            skip_incompatible_checkpoint=True,
            workload_id=w.workload_id,
        )
        w.tenant = started.tenant
        self.book.tenants[w.tenant_id] = started.tenant

    async def restart_training(self) -> None:
        """The training role's in-place restart: rebuild every live tenant's slot.

        Jobs in flight fail ``role_restarted`` (never counted against the workload);
        each trainable tenant's slot is recreated from its latest checkpoint — which
        holds every completed update — and published again; the producers go on.
        """
        training = self.supervisor.training
        async with self._training_lock:
            for w in list(self.book.workloads.values()):
                if w.state.is_terminal or w.task not in TRAINABLE or w.tenant is None:
                    continue
                await self.supervisor.fail_in_flight(w, ROLE_RESTARTED_REASON)
                tenant = w.tenant
                assert tenant.config is not None
                with contextlib.suppress(NotFoundError):
                    await training.remove_tenant(w.tenant_id)
                await training.add_tenant(tenant.config)
                with contextlib.suppress(NotFoundError):
                    tenant.last_checkpoint_version = await training.restore(w.tenant_id)
                    tenant.jobs_applied = self.jobs_applied(w.tenant_id)
                await publish(self.supervisor.ctx, w.tenant_id)
                tenant.metrics.write(
                    "training_restarted", policy_version=tenant.last_checkpoint_version
                )
