"""The workload lifecycle API of the Master: submit, pause, resume, cancel, wait.

Every call names a workload by id and the tenant that asks; another tenant's id
answers as an unknown one (:meth:`WorkloadBook.owned`).
"""

from __future__ import annotations

import asyncio

from joynexus.api import WorkloadState, WorkloadStatus
from joynexus.errors import ConflictError, unknown_id
from joynexus.master.compiler import SpecCompiler
from joynexus.master.faults import service_failure
from joynexus.master.limits import MasterLimits
from joynexus.master.records import TRAINABLE, Workload, WorkloadBook
from joynexus.master.reporting import Reporter
from joynexus.master.supervision import Supervisor
from joynexus.spec.workload import TaskKind, WorkloadSpec
from joynexus.utils.ids import random_id

__all__ = ["Lifecycle"]


class Lifecycle:
    """Tenant-facing workload state changes (see module docstring)."""

    def __init__(
        self,
        book: WorkloadBook,
        compiler: SpecCompiler,
        supervisor: Supervisor,
        reporter: Reporter,
        limits: MasterLimits,
    ) -> None:
        self.book = book
        self.compiler = compiler
        self.supervisor = supervisor
        self.reporter = reporter
        self.limits = limits

    async def submit(self, spec: WorkloadSpec, tenant_id: str) -> WorkloadStatus:
        """Validate, compile, record and start a workload; answers at once (``starting``).

        Raises:
            PermissionDeniedError, SpecError, DatasetError: see
                :meth:`SpecCompiler.compile`.
            ConflictError: the tenant already runs a trainable workload, or has
                ``max_active_workloads_per_tenant`` live ones.
        """
        book = self.book
        compiled = await asyncio.to_thread(self.compiler.compile, spec, tenant_id)
        live = [w for w in book.live() if w.tenant_id == tenant_id]
        if len(live) >= self.limits.max_active_workloads_per_tenant:
            raise ConflictError(
                f"tenant {tenant_id!r} has {len(live)} live workloads, the server's limit; "
                f"cancel one first: {[w.workload_id for w in live]}",
                limit=self.limits.max_active_workloads_per_tenant,
            )
        if compiled.task in TRAINABLE:
            busy = [w.workload_id for w in live if w.task in TRAINABLE]
            if busy:
                raise ConflictError(
                    f"tenant {tenant_id!r} already runs trainable workload {busy[0]!r} (one "
                    "slot per tenant); wait for it or cancel it",
                    workload_id=busy[0],
                )
        elif compiled.task is TaskKind.EVAL:
            assert compiled.spec.evaluation is not None
            trainable = {w.tenant_id for w in book.live() if w.task in TRAINABLE}
            missing = [
                t
                for t in compiled.spec.evaluation.targets
                if t not in book.tenants and t not in trainable
            ]
            if missing:
                raise ConflictError(
                    f"{missing} have no policy to evaluate yet; submit an rl, sft or custom "
                    "workload for them first",
                    field="evaluation.targets",
                )
        seq = next(book.seq)
        wid = random_id("wl")  # ``seq`` keeps the order, the id tells nothing
        w = Workload(wid, compiled, book.clock.wall(), seq, progress_at=book.clock.now())
        # Recorded before it is known: a full disk answers 507 and leaves nothing behind.
        book.save(w)
        book.workloads[wid] = w
        book.write_manifest(w)
        self.supervisor.start(w)
        return self.reporter.status(tenant_id, wid)

    async def pause(self, tenant_id: str, workload_id: str) -> WorkloadStatus:
        """Stop new reservations of an rl/sft workload; in-flight jobs still finish.

        Raises:
            ConflictError: not a running rl/sft workload.
        """
        w = self.book.owned(tenant_id, workload_id)
        if w.task not in (TaskKind.RL, TaskKind.SFT) or w.state is not WorkloadState.RUNNING:
            raise ConflictError(
                f"workload {workload_id!r} ({w.task.value}, {w.state.value}) cannot be paused; "
                "only running rl and sft workloads can",
                state=w.state.value,
            )
        self.supervisor.apply_pause(w)
        w.state = WorkloadState.PAUSED
        self.book.save(w)
        self.book.write_event(w, "paused")
        return self.reporter.status(tenant_id, workload_id)

    async def resume(self, tenant_id: str, workload_id: str) -> WorkloadStatus:
        """Let a paused workload reserve jobs again; or start a workload the service
        failed (global restart, spent recovery budget) again from its checkpoints.

        Raises:
            ConflictError: the workload is neither paused nor failed by the service.
        """
        w = self.book.owned(tenant_id, workload_id)
        if w.state is WorkloadState.FAILED and service_failure(w.error):
            # The service failed it (its restarts spent), not its jobs: an operator
            # starts it again from its checkpoints, with a fresh restart budget.
            self.supervisor.workload_restarts.forget(w.workload_id)
            await self.supervisor.halt(w)
            self.supervisor.relaunch(w, "resumed_by_operator")
            return self.reporter.status(tenant_id, workload_id)
        if w.state is not WorkloadState.PAUSED:
            raise ConflictError(
                f"workload {workload_id!r} is {w.state.value}, not paused (a failed "
                "workload can be resumed only when the service failed it: "
                "global_restart or a spent recovery budget)",
                state=w.state.value,
            )
        assert w.admission is not None and w.compiled.task_type is not None
        self.book.scheduler.set_policy(tenant_id, w.compiled.task_type, w.admission)
        w.state = WorkloadState.RUNNING
        w.progress_at = self.book.clock.now()  # the watchdog counts from the resume
        self.book.save(w)
        self.book.write_event(w, "resumed")
        return self.reporter.status(tenant_id, workload_id)

    async def cancel(self, tenant_id: str, workload_id: str) -> WorkloadStatus:
        """Stop a workload and release what it holds (a finished one is left as it is)."""
        w = self.book.owned(tenant_id, workload_id)
        if not w.state.is_terminal:
            await self.supervisor.cancel(w)
        return self.reporter.status(tenant_id, workload_id)

    async def wait(self, workload_id: str, *, timeout_s: float | None = None) -> WorkloadStatus:
        """Wait until a workload ended (``joynexus run``); its final status.

        Raises:
            NotFoundError: no such workload.
            TimeoutError: still live after ``timeout_s``.
        """
        w = self.book.workloads.get(workload_id)
        if w is None:
            raise unknown_id("workload", workload_id)
        clock = self.book.clock
        deadline = None if timeout_s is None else clock.now() + timeout_s
        while not w.state.is_terminal:
            if deadline is not None and clock.now() >= deadline:
                raise TimeoutError(f"workload {workload_id} still {w.state.value}")
            await clock.sleep(max(self.supervisor.ctx.poll_s, 0.02))
        return self.reporter.status(w.tenant_id, workload_id)
