"""The workload orchestrator of the Master: one supervisor task per workload.

A supervisor launches its workload on the shared plane (RL connects rollout +
inference + environment + training; SFT a data producer to training; evaluation
inference + environment with no optimization path; custom only the tenant's slot),
waits for its producer and in-flight jobs, and finishes it: a final checkpoint, the
SFT weights published, held-out error and success rate measured. A workload whose
jobs fail ``max_failures`` times ends ``failed`` with its reason; one with no progress
for ``watchdog_factor`` × its expected job time is flagged ``stalled`` (the watchdog).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from joynexus.api import WorkloadState
from joynexus.control.job import JobState, TaskType
from joynexus.data.record import record_missing_dataset
from joynexus.errors import (
    ConflictError,
    JoyNexusError,
    NotFoundError,
    ServiceUnavailableError,
    SimulatorCrashedError,
)
from joynexus.master.records import (
    CANCELLED_REASON,
    RESTARTED_REASON,
    TRAINABLE,
    Workload,
    WorkloadBook,
)
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.checkpoints.payload import MANIFEST_FILE, find_latest_checkpoint
from joynexus.runtime.budgets import DEFAULT_WINDOW_S, RecoveryBudget
from joynexus.services.protocols import (
    EnvironmentServiceAPI,
    InferenceModelServiceAPI,
    TrainingModelServiceAPI,
    TrainingQueueAPI,
)
from joynexus.spec.workload import TaskKind
from joynexus.workflows import launch
from joynexus.workflows.actor import settle_committed
from joynexus.workflows.commit import publish
from joynexus.workflows.compile import CompiledWorkload
from joynexus.workflows.context import MetricsLog, WorkflowContext, WorkflowTenant, reason_of
from joynexus.workflows.sft import heldout_action_error
from joynexus.workflows.success import Phase, measure_success, recorded_measure

__all__ = ["Supervisor"]

log = logging.getLogger(__name__)
#: How long a workload that met an unavailable role waits for the Health Manager's
#: decision (restart in place or global restart) before it fails on that error.
_HEALTH_DECISION_S = 10.0
#: Metrics kinds that count as an evaluation's progress (a run, a suite's finished task).
EVAL_PROGRESS = ("eval", "eval_task")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class SupervisionSettings:
    """How the supervisors judge and wait (see :class:`MasterService`'s arguments)."""

    max_failures: int = 5
    heldout_samples: int | None = None
    watchdog_factor: float = 20.0
    watchdog_min_s: float = 120.0
    restart_grace_s: float = 60.0
    poll_s: float = 0.05


class Supervisor:
    """Launches, watches, finishes and tears down workloads (see module docstring)."""

    def __init__(
        self,
        book: WorkloadBook,
        ctx: WorkflowContext,
        *,
        base: ResidentBaseModel,
        queue: TrainingQueueAPI,
        env: EnvironmentServiceAPI,
        training: TrainingModelServiceAPI,
        inference: InferenceModelServiceAPI,
        settings: SupervisionSettings,
    ) -> None:
        self.book = book
        self.ctx = ctx
        self.base = base
        self.queue = queue
        self.env = env
        self.training = training
        self.inference = inference
        self.settings = settings
        self.clock = book.clock
        self.scheduler = book.scheduler
        self.actor_forward: asyncio.Task[None] | None = None
        #: Global restarts each workload may be resumed from (MasterHost sets the
        #: Health Manager's budget and window); past it, a global restart fails it.
        self.workload_restarts = RecoveryBudget(3, DEFAULT_WINDOW_S, self.clock)

    @property
    def _poll(self) -> float:
        return max(self.ctx.poll_s, 0.02)

    def start(self, w: Workload) -> None:
        """Start ``w``'s supervisor task."""
        w.supervisor = asyncio.create_task(self.supervise(w), name=f"master:{w.workload_id}")

    async def supervise(self, w: Workload) -> None:
        try:
            await self._launch(w)
            if w.resume_paused:
                self.apply_pause(w)
                w.state = WorkloadState.PAUSED
            elif w.state is WorkloadState.STARTING:
                w.state = WorkloadState.RUNNING
            w.progress_at = self.clock.now()
            self.book.save(w, defer_if_full=True)
            self.book.write_event(w, w.state.value)
            if w.task is TaskKind.CUSTOM:
                return  # endpoints only: it runs until the tenant cancels it
            await self._wait_done(w)
            await self._finish(w)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if isinstance(error, ServiceUnavailableError):
                await self._await_health_decision(w)
                if w.state.is_terminal:
                    return
            log.warning("workload %s failed: %s", w.workload_id, error)
            text = str(error).splitlines()[0][:500] if str(error) else type(error).__name__
            await self.end_failed(w, text)

    async def _await_health_decision(self, w: Workload) -> None:
        """Wait a little for the Health Manager before failing ``w`` on a role that
        answered unavailable.

        A dead role is the Health Manager's to judge: it restarts the role or escalates
        to a global restart, which halts ``w`` (cancelling this task) or fails it with
        the real cause. Under load the workload's own call can see the dead role first;
        failing at once would record the symptom instead of that cause.
        """
        deadline = self.clock.now() + min(self.settings.restart_grace_s, _HEALTH_DECISION_S)
        while not w.state.is_terminal and self.clock.now() < deadline:
            await self.clock.sleep(self._poll)

    def apply_pause(self, w: Workload) -> None:
        assert w.admission is not None and w.compiled.task_type is not None
        paused = w.admission.model_copy(update={"max_in_flight": 0})
        self.scheduler.set_policy(w.tenant_id, w.compiled.task_type, paused)

    # ---------------------------------------------------------------- teardown

    async def end_failed(self, w: Workload, reason: str) -> None:
        if w.state.is_terminal:
            return
        w.error = reason
        w.state = WorkloadState.FAILED
        w.finished_at = self.clock.wall()
        self.book.save(w, defer_if_full=True)
        if w.producer is not None and not w.producer.done():
            w.producer.cancel()
            await asyncio.gather(w.producer, return_exceptions=True)
        await self.fail_in_flight(w, CANCELLED_REASON)
        await self._close_sessions(w)
        self.book.write_event(w, "failed", error=w.error)

    async def cancel(self, w: Workload) -> None:
        w.state = WorkloadState.CANCELLED
        w.finished_at = self.clock.wall()
        self.book.save(w, defer_if_full=True)
        tasks = [t for t in (w.producer, w.supervisor) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.fail_in_flight(w, CANCELLED_REASON)
        await self._close_sessions(w)
        if w.task in TRAINABLE:
            await self.release_slot(w.tenant_id)
        self.book.write_event(w, "cancelled")

    async def fail_in_flight(self, w: Workload, reason: str) -> None:
        if w.task not in TRAINABLE:
            return
        for job in self.book.jobs_of(w):
            if job.is_terminal:
                continue
            await self.queue.async_clear(job.partition_id)
            if settle_committed(self.ctx, job):  # its update is in the weights already
                continue
            with contextlib.suppress(JoyNexusError):
                self.scheduler.fail(job.job_id, reason)

    async def _close_sessions(self, w: Workload) -> None:
        keep = {
            o.tenant.session_id
            for o in self.book.workloads.values()
            if o is not w and o.tenant_id == w.tenant_id and not o.state.is_terminal and o.tenant
        }
        mine = {w.tenant.session_id} if w.tenant is not None else set()
        if w.task is TaskKind.CUSTOM:  # the tenant's own sessions are this workload's
            mine |= {s.session_id for s in await self.env.list_sessions(w.tenant_id)}
        for sid in mine - keep:
            if sid is not None:
                with contextlib.suppress(JoyNexusError):
                    await self.env.close(sid, tenant_id=w.tenant_id)

    async def release_slot(self, tenant_id: str) -> None:
        """Free the tenant's training and serving slots."""
        self.book.tenants.pop(tenant_id, None)
        with contextlib.suppress(NotFoundError):
            await self.training.remove_tenant(tenant_id)
        with contextlib.suppress(NotFoundError):
            await self.inference.remove_tenant(tenant_id)

    # ------------------------------------------------------------------ launch

    async def _launch(self, w: Workload) -> None:
        c, tid = w.compiled, w.tenant_id
        spec = c.spec
        if c.needs_recording and spec.dataset is not None and not spec.dataset.path.exists():
            await asyncio.to_thread(record_missing_dataset, spec)
        session_id = await launch.open_session(self.env, c)
        metrics = self.book.metrics_log(w)
        if c.config is not None and (tid in self.book.tenants or tid in self.training.tenant_ids()):
            await self.release_slot(tid)  # a finished workload's slot: rebuilt below
        c = await self._with_init_checkpoint(w, c, metrics)
        started = await launch.start_tenant(
            c,
            base=self.base,
            training=self.training,
            inference=self.inference,
            metrics=metrics,
            session_id=session_id,
            serve=True,
            skip_incompatible_checkpoint=True,  # another interface's checkpoint: fresh
            heldout_samples=self.settings.heldout_samples if w.restarts == 0 else None,
            workload_id=w.workload_id,
        )
        w.tenant = started.tenant
        w.source = started.source
        if started.heldout_initial is not None:
            w.heldout_initial = started.heldout_initial
            metrics.write("heldout_initial", error=started.heldout_initial)
        if c.config is None:  # evaluation: read-only, no slot of its own
            await self._await_targets(w)
            done_runs = {int(r["run"]) for r in metrics.of_kind("eval") if "run" in r}
            started.tenant.eval_first_run = max(done_runs) + 1 if done_runs else 0
            w.producer = launch.start_producer(self.ctx, c, started)
            return
        self.book.tenants[tid] = started.tenant
        if c.task is TaskKind.CUSTOM:
            return
        ev = spec.success_eval
        if ev is not None and ev.initial and recorded_measure(metrics.records, "initial") is None:
            await self._measure_success(started.tenant, "initial")
        assert c.admission is not None and c.task_type is not None
        if w.completed_before is None:  # first start; a resumed workload keeps its base
            w.completed_before = self.completed(tid, c.task_type)
        target = c.admission.completion_target
        w.admission = c.admission.model_copy(
            update={"completion_target": None if target is None else w.completed_before + target}
        )
        self.scheduler.set_policy(tid, c.task_type, w.admission)
        if launch.uses_actor_forward(c) and self.actor_forward is None:
            self.actor_forward = launch.start_actor_forward(self.ctx, prefix="master:")
        w.producer = launch.start_producer(self.ctx, c, started)

    async def _with_init_checkpoint(
        self, w: Workload, c: CompiledWorkload, metrics: MetricsLog
    ) -> CompiledWorkload:
        """``c`` with the checkpoint its ``init_from`` names (SFT → RL handoff).

        A tenant name waits until that tenant's live workloads ended, then takes its
        latest checkpoint; anything else is a checkpoint directory.

        Raises:
            ConflictError: the source tenant ended without a checkpoint, or the path
                holds none.
        """
        src = c.spec.init_from
        if src is None or c.config is None:
            return c
        while any(o.tenant_id == src and o is not w for o in self.book.live()):
            await self.clock.sleep(self._poll)
        path = find_latest_checkpoint(self.book.output_root, src) if "/" not in src else None
        if path is None:
            if not (Path(src) / MANIFEST_FILE).is_file():
                raise ConflictError(
                    f"init_from {src!r}: no checkpoint to start from (the tenant ended "
                    "without an update, or the path holds no manifest.json)"
                )
            path = Path(src)
        metrics.write("init_from", source=src, checkpoint=str(path))
        config = c.config.model_copy(update={"init_checkpoint": path})
        return dataclasses.replace(c, config=config)

    async def _await_targets(self, w: Workload) -> None:
        """An evaluation submitted with its targets' workloads waits for their slots.

        Raises:
            ConflictError: a target's workload ended before it got a slot.
        """
        ev = w.compiled.spec.evaluation
        assert ev is not None
        while missing := [t for t in ev.targets if t not in self.book.tenants]:
            live = {o.tenant_id for o in self.book.live() if o.task in TRAINABLE}
            gone = [t for t in missing if t not in live]
            if gone:
                raise ConflictError(f"evaluation targets {gone} have no policy to evaluate")
            await self.clock.sleep(self._poll)

    def completed(self, tenant_id: str, task_type: TaskType) -> int:
        jobs = self.scheduler.list_jobs(tenant_id=tenant_id, state=JobState.COMPLETED)
        return sum(1 for j in jobs if j.task_type is task_type)

    # ------------------------------------------------------------------ finish

    async def _wait_done(self, w: Workload) -> None:
        assert w.producer is not None
        while True:
            if w.state.is_terminal:
                return
            if w.producer.done():
                exc = None if w.producer.cancelled() else w.producer.exception()
                if exc is not None:
                    raise exc
                if w.task is TaskKind.EVAL or not self.book.in_flight(w):
                    return
            elif w.task is not TaskKind.EVAL and self.book.failed(w) >= self.settings.max_failures:
                w.producer.cancel()
                await asyncio.gather(w.producer, return_exceptions=True)
                errors = w.tenant.errors[-1:] if w.tenant else []
                last = f"; last: {errors[0]}" if errors else ""
                raise RuntimeError(f"{self.book.failed(w)} training jobs failed{last}")
            self.watch(w)
            if self.book.unsaved:
                self.book.flush()
            await self.clock.sleep(self._poll)

    async def _finish(self, w: Workload) -> None:
        tid, tenant = w.tenant_id, w.tenant
        assert tenant is not None
        if w.task is TaskKind.EVAL:
            assert w.producer is not None
            w.eval_runs = tenant.eval_first_run + len(w.producer.result())
        else:
            version = self.training.policy_version(tid)
            latest = self.training.latest_checkpoint(tid)
            if version > 0 and (latest is None or latest.name != f"step_{version}"):
                ledger = {"jobs_applied": tenant.jobs_applied, "workload_id": w.workload_id}
                await self.training.save(version, [tid], include_optim=True, ledger=ledger)
                tenant.last_checkpoint_version = version
                await self.training.prune_checkpoints(
                    tid, keep_last=tenant.spec.scheduling.keep_last
                )
            tenant.metrics.write("checkpoint", policy_version=version)
            # SFT updates are served from now on. An engine the Health Manager is
            # restarting answers unavailable for a moment: the trained weights are
            # already checkpointed, so wait for it rather than fail the workload.
            await self._while_restarting(lambda: publish(self.ctx, tid))
            frames = self.settings.heldout_samples
            if w.source is not None and frames is not None:
                source = w.source
                err = await self._while_restarting(
                    lambda: heldout_action_error(self.inference, tid, source, max_samples=frames)
                )
                initial = next(
                    (r.get("error") for r in tenant.metrics.of_kind("heldout_initial")), None
                )
                tenant.metrics.write("heldout", initial=initial, final=err, policy_version=version)
            if tenant.spec.success_eval is not None:
                await self._while_restarting(lambda: self._measure_success(tenant, "final"))
        if tenant.session_id is not None:
            with contextlib.suppress(JoyNexusError):
                await self.env.close(tenant.session_id, tenant_id=tid)
        w.state = WorkloadState.COMPLETED
        w.finished_at = self.clock.wall()
        self.book.save(w, defer_if_full=True)
        self.book.write_event(w, "completed")

    async def _measure_success(self, tenant: WorkflowTenant, phase: Phase) -> None:
        """Measure and record the tenant's success rate; a failed measurement is an
        error of the workload's record, never a failed workload (its training stands).

        A simulator that crashes or misses a step mid-measurement is recreated by session
        recovery; the measurement then runs once more, from its first seed, on the new
        session (the same episodes), so a slow moment does not lose the figure.
        """
        failure: JoyNexusError
        for attempt in range(2):
            session = tenant.session_id
            try:
                await measure_success(self.inference, tenant, phase)
                return
            except ServiceUnavailableError:
                raise  # a role being restarted: the caller waits it out
            except SimulatorCrashedError as error:
                failure = error
                if attempt == 0 and await self._session_replaced(tenant, session):
                    log.warning("%s success rate of %s: %s; again", phase, tenant.tenant_id, error)
                    continue
            except JoyNexusError as error:
                failure = error
            break
        log.warning("%s success rate of %s: %s", phase, tenant.tenant_id, failure)
        tenant.errors.append(f"success_eval {phase}: {reason_of(failure)}")

    async def _session_replaced(self, tenant: WorkflowTenant, crashed: str | None) -> bool:
        """Whether session recovery gave ``tenant`` a new session within
        ``restart_grace_s`` of its ``crashed`` one."""
        deadline = self.clock.now() + self.settings.restart_grace_s
        while tenant.session_id in (None, crashed):
            if self.clock.now() >= deadline:
                return False
            await self.clock.sleep(max(self.settings.poll_s, 0.1))
        return True

    async def _while_restarting(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, retried while a service answers unavailable (a role being
        restarted in place) for at most ``restart_grace_s``."""
        deadline = self.clock.now() + self.settings.restart_grace_s
        while True:
            try:
                return await call()
            except ServiceUnavailableError:
                if self.clock.now() >= deadline:
                    raise
                await self.clock.sleep(max(self.settings.poll_s, 0.1))

    # ---------------------------------------------------------------- watchdog

    def _progress(self, w: Workload) -> tuple[int, int, int]:
        tally = self.book.tally(w)
        metrics = w.tenant.metrics if w.tenant is not None else None
        # An evaluation's runs, and each task of a suite evaluation as it finishes.
        evals = 0 if metrics is None else len(metrics.of_kind(*EVAL_PROGRESS))
        return (tally.terminal, tally.total, evals)

    def expected_job_s(self, w: Workload) -> float | None:
        """Mean wall time of the workload's completed jobs (None before the first)."""
        tally = self.book.tally(w)
        return tally.completed_span_s / tally.completed if tally.completed else None

    def watch(self, w: Workload) -> None:
        """The watchdog: flag a running workload that has made no progress for long."""
        mark = self._progress(w)
        now = self.clock.now()
        if mark != w.progress_mark or w.state is not WorkloadState.RUNNING:
            if w.stalled is not None and mark != w.progress_mark:
                self.book.write_event(w, "progressing")
            w.progress_mark, w.progress_at, w.stalled = mark, now, None
            return
        expected = self.expected_job_s(w)
        s = self.settings
        limit = max(s.watchdog_min_s, s.watchdog_factor * (expected or 0.0))
        silent = now - w.progress_at
        if w.stalled is None and silent > limit:
            w.stalled = (
                f"no progress for {silent:.0f} s (limit {limit:.0f} s = "
                f"{s.watchdog_factor:g} x expected job time "
                f"{'unknown' if expected is None else f'{expected:.1f} s'}, at least "
                f"{s.watchdog_min_s:g} s)"
            )
            log.warning("workload %s stalled: %s", w.workload_id, w.stalled)
            self.book.write_event(w, "stalled", reason=w.stalled)

    async def fail_live(self, reason: str) -> list[str]:
        """End every live workload ``failed`` with ``reason``. Returns their ids."""
        ended = []
        for w in self.book.live():
            await self._stop_failed(w, reason)
            ended.append(w.workload_id)
        return ended

    async def fail_holder(self, tenant: WorkflowTenant, reason: str) -> list[str]:
        """End the live workloads ``tenant`` runs ``failed`` with ``reason`` (its own
        recovery budget is spent); every other workload goes on. Returns their ids."""
        mine = [w for w in self.book.live() if w.tenant is tenant]
        for w in mine:
            await self._stop_failed(w, reason)
        return [w.workload_id for w in mine]

    async def _stop_failed(self, w: Workload, reason: str) -> None:
        if w.supervisor is not None and not w.supervisor.done():
            w.supervisor.cancel()
            await asyncio.gather(w.supervisor, return_exceptions=True)
        await self.end_failed(w, reason[:500])

    async def halt(self, w: Workload) -> None:
        """Stop a workload's loops and release what it holds (its record stays)."""
        tasks = [t for t in (w.producer, w.supervisor) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.fail_in_flight(w, RESTARTED_REASON)
        await self._close_sessions(w)

    def relaunch(self, w: Workload, event: str) -> None:
        """Start a halted workload again from its tenant's latest checkpoint (what a
        restarted Master does for a workload a dead process left)."""
        w.resume_paused = w.state is WorkloadState.PAUSED or (
            w.state is WorkloadState.STARTING and w.resume_paused
        )
        w.restarts += 1
        w.state = WorkloadState.STARTING
        w.error = w.finished_at = w.stalled = w.producer = None
        self.book.save(w, defer_if_full=True)
        self.book.write_event(w, event, restarts=w.restarts)
        self.start(w)
