"""The Master Service (paper §4.1.1): tenant creator and the one workload orchestrator.

One Master hosts workloads on ONE long-lived execution plane (resident base model,
Training Scheduler, Training Queue, Environment / Training / Inference Model Services).
Every entry point runs workloads through it: ``joynexus run`` (an in-process Master,
to completion: :mod:`joynexus.master.run`), ``joynexus serve`` (the same Master behind
HTTP, where tenants submit, pause, resume and cancel at any time) and ``joynexus demo``.

* **Tenant creator** (:meth:`MasterService.compile`): strict validation of a
  :class:`WorkloadSpec` against what this backend can do — the resident base model, the
  registered environment kinds, the dataset roots, the server's limits, the backbone's
  camera slots — through :func:`joynexus.workflows.compile.compile_workloads`.
* **Workload orchestrator**: RL connects rollout + inference + environment + training
  (:func:`~joynexus.workflows.rl.rl_producer`); SFT connects a data producer to training
  (:func:`~joynexus.workflows.sft.sft_producer`); evaluation reuses inference +
  environment with no optimization path (:func:`~joynexus.workflows.evaluation.evaluator`);
  custom creates only the tenant's slot, which the tenant drives through the low-level
  primitives. One actor consumer, one advantage stage and (on demand) one actor-forward
  stage serve every tenant (:mod:`joynexus.workflows.launch`).

**Durability.** Workload records (:mod:`joynexus.master.store`) live in the run
directory's ``scheduler.sqlite`` next to the scheduler's jobs; every job a workload's
producer reserves carries the workload's id, and every update is checkpointed *before*
it is published or its job completes, with a ledger naming the job
(``WorkflowContext.durable_checkpoints``). :meth:`MasterService.start` on the same run
directory therefore brings everything back by itself:

1. jobs left in flight are reconciled with the checkpoints: the one whose update reached
   its tenant's latest checkpoint completes; the others fail ``runtime_restarted`` (their
   partitions lived in the dead process) and the producers reserve new ones;
2. every workload that was running continues from its tenant's latest checkpoint (so a
   version number is never issued for two different weights and never goes back, and
   the completed jobs are exactly the updates in the weights); paused ones come back
   paused; ended ones stay ended, and the last policy of each tenant is served again.

A clean shutdown (:meth:`aclose`) stops the loops without touching the records, so a
SIGTERM restart resumes exactly like a crash does.

**Visible failure.** A workload whose jobs fail ``max_failures`` times, or whose roles
cannot be recovered (:meth:`fail_live`, called when the Health Manager's budget is
spent), ends ``failed`` with its reason. A workload with no progress for
``watchdog_factor`` × its expected job time is flagged ``stalled`` in its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from joynexus.api import WorkloadMetrics, WorkloadState, WorkloadStatus
from joynexus.control.admission import AdmissionPolicy, GlobalLimit
from joynexus.control.job import JobState, TaskType, TrainingJob
from joynexus.control.scheduler import TrainingScheduler
from joynexus.data.record import record_missing_dataset
from joynexus.errors import (
    ConflictError,
    JoyNexusError,
    NotFoundError,
    PermissionDeniedError,
    ServiceUnavailableError,
    SpecError,
)
from joynexus.master.limits import MasterLimits, check_limits
from joynexus.master.primitives import ModelPrimitives
from joynexus.master.store import InMemoryWorkloadStore, WorkloadRecord, WorkloadStore
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.heads import Pi0ExpertConfig
from joynexus.models.payload import MANIFEST_FILE, find_latest_checkpoint, read_manifest
from joynexus.models.pi0 import pi0_checkpoint_of
from joynexus.services.protocols import (
    EnvironmentServiceAPI,
    InferenceModelServiceAPI,
    TrainingModelServiceAPI,
    TrainingQueueAPI,
)
from joynexus.spec.workload import TaskKind, WorkloadSpec
from joynexus.utils.clock import Clock, SystemClock
from joynexus.workflows import launch
from joynexus.workflows.actor import publish, settle_committed
from joynexus.workflows.compile import (
    DEFAULT_MAX_ACTIVE_ROLLOUTS,
    DEFAULT_MAX_ACTIVE_ROLLOUTS_PER_TENANT,
    DOMAIN,
    CompiledWorkload,
    compile_workloads,
)
from joynexus.workflows.context import (
    ROLE_RESTARTED_REASON,
    MetricsLog,
    WorkflowContext,
    WorkflowTenant,
    reason_of,
)
from joynexus.workflows.sft import SFTSource, heldout_action_error
from joynexus.workflows.success import Phase, measure_success, recorded_measure

__all__ = [
    "CANCELLED_REASON",
    "RESTARTED_REASON",
    "ROLE_RESTARTED_REASON",
    "MasterService",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Terminal reason of the jobs a cancelled workload leaves in flight.
CANCELLED_REASON = "cancelled"
#: Terminal reason of the jobs a previous process left in flight (not the job's fault).
RESTARTED_REASON = "runtime_restarted"
#: Failures that are the service's, not the workload's: they never count against it.
_NOT_THE_JOBS_FAULT = (CANCELLED_REASON, RESTARTED_REASON, ROLE_RESTARTED_REASON)
_TRAINABLE = (TaskKind.RL, TaskKind.SFT, TaskKind.CUSTOM)


@dataclass
class _Workload:
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


class MasterService(ModelPrimitives):
    """Hosts workloads of many tenants on one set of services (see module docstring).

    Args:
        base: The resident base model.
        base_model_id: Its id as specs name it.
        scheduler: The Training Scheduler (opened with ``keep_in_flight=True`` when
            workloads are durable: the Master reconciles what a dead process left).
        queue: The Training Queue.
        env: The Environment Service.
        training: The Training Model Service.
        inference: The Inference Model Service (started by the caller).
        output_root: Tenant output dirs are ``<output_root>/<tenant>``; specs' own
            ``output_dir`` is replaced by it (the server decides where artifacts go).
        limits: What the tenant creator accepts.
        clock: Time source of the loops.
        poll_s: Back-off of producers and the supervisors.
        max_failures: A workload whose jobs failed this many times ends ``failed``.
        store: Where workload records are kept (default: in memory, forgotten with
            the process; a server passes ``SQLiteWorkloadStore`` on its run dir).
        heldout_samples: Measure SFT held-out action error on this many frames at the
            start and the end of an SFT workload (None: do not).
        watchdog_factor: Flag a workload ``stalled`` after this many expected job
            times without progress.
        watchdog_min_s: ... but never before this many seconds without progress.
        restart_grace_s: How long a finishing workload waits for a service that
            answers unavailable (a role the Health Manager is restarting).
    """

    def __init__(
        self,
        *,
        base: ResidentBaseModel,
        base_model_id: str,
        scheduler: TrainingScheduler,
        queue: TrainingQueueAPI,
        env: EnvironmentServiceAPI,
        training: TrainingModelServiceAPI,
        inference: InferenceModelServiceAPI,
        output_root: Path,
        limits: MasterLimits | None = None,
        clock: Clock | None = None,
        poll_s: float = 0.05,
        max_failures: int = 5,
        store: WorkloadStore | None = None,
        heldout_samples: int | None = None,
        watchdog_factor: float = 20.0,
        watchdog_min_s: float = 120.0,
        restart_grace_s: float = 60.0,
    ) -> None:
        self.base = base
        self.base_model_id = base_model_id
        self.scheduler = scheduler
        self.queue = queue
        self.env = env
        self.training = training
        self.inference = inference
        # Absolute: specs get it as their output_dir, and the Training Model Service
        # resolves a relative one against its own output directory (a relative run
        # directory would nest the checkpoints where recovery and init_from never look).
        self.output_root = Path(output_root).resolve()
        self.limits = limits or MasterLimits()
        self.clock: Clock = clock or SystemClock()
        self.max_failures = max_failures
        self.store: WorkloadStore = store or InMemoryWorkloadStore()
        self.heldout_samples = heldout_samples
        self.watchdog_factor = watchdog_factor
        self.watchdog_min_s = watchdog_min_s
        self.restart_grace_s = restart_grace_s
        self.poll_s = poll_s
        self._tenants: dict[str, WorkflowTenant] = {}  # trainable tenants with a slot
        self._workloads: dict[str, _Workload] = {}
        self._seq = itertools.count(1)
        self._loops: list[asyncio.Task[None]] = []
        self._actor_forward: asyncio.Task[None] | None = None
        self._started = False
        self._training_lock = asyncio.Lock()
        self.ctx = WorkflowContext(
            scheduler=scheduler,
            queue=queue,
            training=training,
            inference=inference,
            clock=self.clock,
            tenants=self._tenants,
            domain=DOMAIN,
            poll_s=poll_s,
            durable_checkpoints=True,
            in_checkpoint=self._in_checkpoint,
            slot_grace_s=restart_grace_s,
        )

    # ------------------------------------------------------------------ lifetime

    async def start(self) -> None:
        """Recover the stored workloads, then start the shared loops.

        Jobs a previous process left in flight are reconciled with the checkpoints
        first (see the module docstring), so the loops never lease a job whose data
        died with that process.
        """
        if self._started:
            return
        self._started = True
        for limit in _global_limits():
            self.scheduler.set_global_limit(limit)
        self._reconcile_jobs()
        await self._recover()
        self._loops = launch.start_stage_loops(self.ctx, prefix="master:")

    async def aclose(self) -> None:
        """Stop every workload's loops and the shared loops; records stay as they are.

        A workload that was running is resumed by the next :meth:`start` on the same
        store (a clean restart behaves like a crash, minus the lost in-flight work).
        """
        tasks = [
            t
            for w in self._workloads.values()
            for t in (w.producer, w.supervisor)
            if t is not None and not t.done()
        ]
        tasks += [*self._loops, *([self._actor_forward] if self._actor_forward else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loops = []
        self._actor_forward = None
        self._started = False

    # ------------------------------------------------------------------ recovery

    def _reconcile_jobs(self) -> None:
        """Settle the jobs a previous process left in flight against the checkpoints."""
        for job in self.scheduler.list_jobs():
            if job.is_terminal:
                continue
            if settle_committed(self.ctx, job):
                # Its update reached the weights; only ``complete`` was lost.
                log.info("recovered job %s: its update is in the checkpoint", job.job_id)
            else:
                with contextlib.suppress(JoyNexusError):
                    self.scheduler.fail(job.job_id, RESTARTED_REASON)

    def _in_checkpoint(self, job: TrainingJob) -> bool:
        latest = find_latest_checkpoint(self.output_root, job.tenant_id)
        if latest is None:
            return False
        try:
            return read_manifest(latest).ledger.get("job_id") == job.job_id
        except JoyNexusError:
            return False

    async def _recover(self) -> None:
        records = self.store.load()
        self._seq = itertools.count(max((r.seq for r in records), default=0) + 1)
        served_again: set[str] = set()
        for r in records:
            w = self._restore_record(r)
            if w is None:
                continue
            self._workloads[w.workload_id] = w
            if not w.state.is_terminal:
                w.restarts += 1
                w.resume_paused = w.state is WorkloadState.PAUSED
                w.state = WorkloadState.STARTING
                self._save(w)
                self._write_event(w, "resumed_after_restart", restarts=w.restarts)
                w.supervisor = asyncio.create_task(
                    self._supervise(w), name=f"master:{w.workload_id}"
                )
                if w.task in _TRAINABLE:
                    served_again.add(w.tenant_id)
        # Tenants whose last trainable workload ended keep serving their last policy.
        ended = [
            w
            for w in reversed(list(self._workloads.values()))
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

    def _restore_record(self, r: WorkloadRecord) -> _Workload | None:
        try:
            spec = WorkloadSpec.model_validate(r.spec)
        except Exception as exc:  # a record this version cannot read: skip it loudly
            log.error("workload record %s is unreadable and skipped: %s", r.workload_id, exc)
            return None
        state, error = r.state, r.error
        try:
            compiled = self.compile(spec, r.tenant_id)
        except JoyNexusError as exc:  # e.g. the server's limits changed under it
            try:  # the same spec without this server's limits, to report on it
                compiled = compile_workloads(
                    [spec],
                    allow_custom=True,
                    require_completion_target=False,
                    served=self._served_schemas(r.tenant_id, any_tenant=True),
                ).workloads[0]
            except JoyNexusError:
                log.error("workload %s cannot be resumed and is skipped: %s", r.workload_id, exc)
                return None
            if not state.is_terminal:
                state = WorkloadState.FAILED
                error = f"cannot resume after a restart: {str(exc).splitlines()[0]}"[:500]
        w = _Workload(r.workload_id, compiled, r.created_at, r.seq, state=state)
        w.finished_at = r.finished_at
        w.completed_before = r.completed_before
        w.final_version = r.final_version
        w.eval_runs = r.eval_runs
        w.error = error
        w.restarts = r.restarts
        w.progress_at = self.clock.now()
        if state is not r.state:
            w.finished_at = self.clock.wall()
            self._save(w)
        return w

    async def _serve_ended(self, w: _Workload) -> None:
        """Give an ended trainable workload's tenant its slot back (restored, served)."""
        metrics = MetricsLog(self._workload_dir(w) / "metrics.jsonl", self.clock, resume=True)
        started = await launch.start_tenant(
            w.compiled,
            base=self.base,
            training=self.training,
            inference=self.inference,
            metrics=metrics,
            session_id=None,
            serve=True,
            skip_incompatible_checkpoint=True,
            workload_id=w.workload_id,
        )
        w.tenant = started.tenant
        self._tenants[w.tenant_id] = started.tenant

    # ------------------------------------------------------------ tenant creator

    def _served_schemas(self, tenant_id: str, *, any_tenant: bool = False) -> dict[str, Any]:
        """Trainable tenants an evaluation may read: with a slot, or a live workload."""
        served = {t: wt.schema for t, wt in self._tenants.items()}
        for w in self._workloads.values():
            if w.compiled.config is not None and w.state is not WorkloadState.CANCELLED:
                served.setdefault(w.tenant_id, w.compiled.schema)
        if any_tenant:
            return served
        return {t: s for t, s in served.items() if t == tenant_id}

    def compile(self, spec: WorkloadSpec, tenant_id: str) -> CompiledWorkload:
        """Validate ``spec`` for ``tenant_id`` against this backend; its compiled form.

        Raises:
            PermissionDeniedError: the spec is for another tenant, or evaluates one.
            SpecError / DatasetError: the spec asks for something this server cannot
                do; ``details.fields`` names the offending fields.
        """
        if spec.tenant != tenant_id:
            raise PermissionDeniedError(
                f"spec.tenant {spec.tenant!r} is not the authenticated tenant {tenant_id!r}; "
                "a tenant submits workloads only for itself",
                field="tenant",
            )
        spec = spec.model_copy(update={"output_dir": self.output_root})
        check_limits(spec, self.limits, self.base_model_id)
        if spec.init_from is not None and not self.limits.cross_tenant_eval:
            raise PermissionDeniedError(
                "init_from reads another tenant's (or a file's) checkpoint; on this server "
                "a tenant continues only its own policy (submit the next workload of the "
                "same tenant: it resumes from its checkpoint)",
                field="init_from",
            )
        if spec.evaluation is not None and not self.limits.cross_tenant_eval:
            others = sorted(set(spec.evaluation.targets) - {tenant_id})
            if others:
                raise PermissionDeniedError(
                    f"evaluation.targets {others} are other tenants; a tenant evaluates only "
                    f"its own policy ({tenant_id!r})",
                    field="evaluation.targets",
                )
        compiled = compile_workloads(
            [spec],
            allow_custom=True,
            served=self._served_schemas(tenant_id, any_tenant=self.limits.cross_tenant_eval),
            require_completion_target=False,
        ).workloads[0]
        slots = self.base.num_camera_slots
        if len(compiled.schema.cameras) > slots:
            raise SpecError(
                f"schema has {len(compiled.schema.cameras)} cameras "
                f"{compiled.schema.camera_names}; the resident base model has {slots} camera "
                "slots",
                field="schema.cameras",
                fields=["schema.cameras"],
                allowed_max=slots,
            )
        if isinstance(compiled.spec.action_module, Pi0ExpertConfig):
            pi0 = pi0_checkpoint_of(self.base, what="action_module type 'pi0_expert'")
            pi0.check_schema(compiled.schema)
        return compiled

    # ---------------------------------------------------------------- lifecycle

    async def submit(self, spec: WorkloadSpec, tenant_id: str) -> WorkloadStatus:
        """Validate, compile, record and start a workload; answers at once (``starting``).

        Raises:
            PermissionDeniedError, SpecError, DatasetError: see :meth:`compile`.
            ConflictError: the tenant already runs a trainable workload, or has
                ``max_active_workloads_per_tenant`` live ones.
        """
        compiled = await asyncio.to_thread(self.compile, spec, tenant_id)
        live = [w for w in self._workloads.values() if w.tenant_id == tenant_id]
        live = [w for w in live if not w.state.is_terminal]
        if len(live) >= self.limits.max_active_workloads_per_tenant:
            raise ConflictError(
                f"tenant {tenant_id!r} has {len(live)} live workloads, the server's limit; "
                f"cancel one first: {[w.workload_id for w in live]}",
                limit=self.limits.max_active_workloads_per_tenant,
            )
        if compiled.task in _TRAINABLE:
            busy = [w.workload_id for w in live if w.task in _TRAINABLE]
            if busy:
                raise ConflictError(
                    f"tenant {tenant_id!r} already runs trainable workload {busy[0]!r} (one "
                    "slot per tenant); wait for it or cancel it",
                    workload_id=busy[0],
                )
        elif compiled.task is TaskKind.EVAL:
            assert compiled.spec.evaluation is not None
            trainable = {w.tenant_id for w in self._live() if w.task in _TRAINABLE}
            missing = [
                t
                for t in compiled.spec.evaluation.targets
                if t not in self._tenants and t not in trainable
            ]
            if missing:
                raise ConflictError(
                    f"{missing} have no policy to evaluate yet; submit an rl, sft or custom "
                    "workload for them first",
                    field="evaluation.targets",
                )
        seq = next(self._seq)
        wid = f"wl-{seq}-{secrets.token_hex(4)}"
        w = _Workload(wid, compiled, self.clock.wall(), seq, progress_at=self.clock.now())
        self._workloads[wid] = w
        self._save(w)
        self._write_manifest(w)
        w.supervisor = asyncio.create_task(self._supervise(w), name=f"master:{wid}")
        return self.status(tenant_id, wid)

    def _owned(self, tenant_id: str, workload_id: str) -> _Workload:
        w = self._workloads.get(workload_id)
        # Another tenant's workload answers like an unknown one: ids are no oracle.
        if w is None or w.tenant_id != tenant_id:
            raise NotFoundError(f"no workload {workload_id!r}", workload_id=workload_id)
        return w

    async def pause(self, tenant_id: str, workload_id: str) -> WorkloadStatus:
        """Stop new reservations of an rl/sft workload; in-flight jobs still finish.

        Raises:
            ConflictError: not a running rl/sft workload.
        """
        w = self._owned(tenant_id, workload_id)
        if w.task not in (TaskKind.RL, TaskKind.SFT) or w.state is not WorkloadState.RUNNING:
            raise ConflictError(
                f"workload {workload_id!r} ({w.task.value}, {w.state.value}) cannot be paused; "
                "only running rl and sft workloads can",
                state=w.state.value,
            )
        self._apply_pause(w)
        w.state = WorkloadState.PAUSED
        self._save(w)
        self._write_event(w, "paused")
        return self.status(tenant_id, workload_id)

    def _apply_pause(self, w: _Workload) -> None:
        assert w.admission is not None and w.compiled.task_type is not None
        paused = w.admission.model_copy(update={"max_in_flight": 0})
        self.scheduler.set_policy(w.tenant_id, w.compiled.task_type, paused)

    async def resume(self, tenant_id: str, workload_id: str) -> WorkloadStatus:
        """Let a paused workload reserve jobs again.

        Raises:
            ConflictError: the workload is not paused.
        """
        w = self._owned(tenant_id, workload_id)
        if w.state is not WorkloadState.PAUSED:
            raise ConflictError(
                f"workload {workload_id!r} is {w.state.value}, not paused", state=w.state.value
            )
        assert w.admission is not None and w.compiled.task_type is not None
        self.scheduler.set_policy(tenant_id, w.compiled.task_type, w.admission)
        w.state = WorkloadState.RUNNING
        w.progress_at = self.clock.now()  # the watchdog counts from the resume
        self._save(w)
        self._write_event(w, "resumed")
        return self.status(tenant_id, workload_id)

    async def cancel(self, tenant_id: str, workload_id: str) -> WorkloadStatus:
        """Stop a workload and release what it holds (a finished one is left as it is)."""
        w = self._owned(tenant_id, workload_id)
        if not w.state.is_terminal:
            await self._cancel(w)
        return self.status(tenant_id, workload_id)

    async def wait(self, workload_id: str, *, timeout_s: float | None = None) -> WorkloadStatus:
        """Wait until a workload ended (``joynexus run``); its final status.

        Raises:
            NotFoundError: no such workload.
            TimeoutError: still live after ``timeout_s``.
        """
        w = self._workloads.get(workload_id)
        if w is None:
            raise NotFoundError(f"no workload {workload_id!r}", workload_id=workload_id)
        deadline = None if timeout_s is None else self.clock.now() + timeout_s
        while not w.state.is_terminal:
            if deadline is not None and self.clock.now() >= deadline:
                raise TimeoutError(f"workload {workload_id} still {w.state.value}")
            await self.clock.sleep(max(self.ctx.poll_s, 0.02))
        return self.status(w.tenant_id, workload_id)

    async def _cancel(self, w: _Workload) -> None:
        w.state = WorkloadState.CANCELLED
        w.finished_at = self.clock.wall()
        self._save(w)
        tasks = [t for t in (w.producer, w.supervisor) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._fail_in_flight(w, CANCELLED_REASON)
        await self._close_sessions(w)
        if w.task in _TRAINABLE:
            await self._release_slot(w.tenant_id)
        self._write_event(w, "cancelled")

    async def _fail_in_flight(self, w: _Workload, reason: str) -> None:
        if w.task not in _TRAINABLE:
            return
        for job in self._jobs_of(w):
            if job.is_terminal:
                continue
            await self.queue.async_clear(job.partition_id)
            if settle_committed(self.ctx, job):  # its update is in the weights already
                continue
            with contextlib.suppress(JoyNexusError):
                self.scheduler.fail(job.job_id, reason)

    async def _close_sessions(self, w: _Workload) -> None:
        keep = {
            o.tenant.session_id
            for o in self._workloads.values()
            if o is not w and o.tenant_id == w.tenant_id and not o.state.is_terminal and o.tenant
        }
        mine = {w.tenant.session_id} if w.tenant is not None else set()
        if w.task is TaskKind.CUSTOM:  # the tenant's own sessions are this workload's
            mine |= {s.session_id for s in await self.env.list_sessions(w.tenant_id)}
        for sid in mine - keep:
            if sid is not None:
                with contextlib.suppress(JoyNexusError):
                    await self.env.close(sid, tenant_id=w.tenant_id)

    async def _release_slot(self, tenant_id: str) -> None:
        """Free the tenant's training and serving slots."""
        self._tenants.pop(tenant_id, None)
        with contextlib.suppress(NotFoundError):
            await self.training.remove_tenant(tenant_id)
        with contextlib.suppress(NotFoundError):
            await self.inference.remove_tenant(tenant_id)

    # ------------------------------------------------------------ orchestration

    async def _supervise(self, w: _Workload) -> None:
        try:
            await self._launch(w)
            if w.resume_paused:
                self._apply_pause(w)
                w.state = WorkloadState.PAUSED
            elif w.state is WorkloadState.STARTING:
                w.state = WorkloadState.RUNNING
            w.progress_at = self.clock.now()
            self._save(w)
            self._write_event(w, w.state.value)
            if w.task is TaskKind.CUSTOM:
                return  # endpoints only: it runs until the tenant cancels it
            await self._wait_done(w)
            await self._finish(w)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("workload %s failed: %s", w.workload_id, error)
            text = str(error).splitlines()[0][:500] if str(error) else type(error).__name__
            await self._end_failed(w, text)

    async def _end_failed(self, w: _Workload, reason: str) -> None:
        if w.state.is_terminal:
            return
        w.error = reason
        w.state = WorkloadState.FAILED
        w.finished_at = self.clock.wall()
        self._save(w)
        if w.producer is not None and not w.producer.done():
            w.producer.cancel()
            await asyncio.gather(w.producer, return_exceptions=True)
        await self._fail_in_flight(w, CANCELLED_REASON)
        await self._close_sessions(w)
        self._write_event(w, "failed", error=w.error)

    async def _launch(self, w: _Workload) -> None:
        c, tid = w.compiled, w.tenant_id
        spec = c.spec
        if c.needs_recording and spec.dataset is not None and not spec.dataset.path.exists():
            await asyncio.to_thread(record_missing_dataset, spec)
        session_id = await launch.open_session(self.env, c)
        metrics = MetricsLog(self._workload_dir(w) / "metrics.jsonl", self.clock, resume=True)
        if c.config is not None and (tid in self._tenants or tid in self.training.tenant_ids()):
            await self._release_slot(tid)  # a finished workload's slot: rebuilt below
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
            heldout_samples=self.heldout_samples if w.restarts == 0 else None,
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
        self._tenants[tid] = started.tenant
        if c.task is TaskKind.CUSTOM:
            return
        ev = spec.success_eval
        if ev is not None and ev.initial and recorded_measure(metrics.records, "initial") is None:
            await self._measure_success(started.tenant, "initial")
        assert c.admission is not None and c.task_type is not None
        if w.completed_before is None:  # first start; a resumed workload keeps its base
            w.completed_before = self._completed(tid, c.task_type)
        target = c.admission.completion_target
        w.admission = c.admission.model_copy(
            update={"completion_target": None if target is None else w.completed_before + target}
        )
        self.scheduler.set_policy(tid, c.task_type, w.admission)
        if launch.uses_actor_forward(c) and self._actor_forward is None:
            self._actor_forward = launch.start_actor_forward(self.ctx, prefix="master:")
        w.producer = launch.start_producer(self.ctx, c, started)

    async def _with_init_checkpoint(
        self, w: _Workload, c: CompiledWorkload, metrics: MetricsLog
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
        while any(o.tenant_id == src and o is not w for o in self._live()):
            await self.clock.sleep(max(self.ctx.poll_s, 0.02))
        path = find_latest_checkpoint(self.output_root, src) if "/" not in src else None
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

    async def _await_targets(self, w: _Workload) -> None:
        """An evaluation submitted with its targets' workloads waits for their slots.

        Raises:
            ConflictError: a target's workload ended before it got a slot.
        """
        ev = w.compiled.spec.evaluation
        assert ev is not None
        while missing := [t for t in ev.targets if t not in self._tenants]:
            live = {o.tenant_id for o in self._live() if o.task in _TRAINABLE}
            gone = [t for t in missing if t not in live]
            if gone:
                raise ConflictError(f"evaluation targets {gone} have no policy to evaluate")
            await self.clock.sleep(max(self.ctx.poll_s, 0.02))

    def _completed(self, tenant_id: str, task_type: TaskType) -> int:
        jobs = self.scheduler.list_jobs(tenant_id=tenant_id, state=JobState.COMPLETED)
        return sum(1 for j in jobs if j.task_type is task_type)

    async def _wait_done(self, w: _Workload) -> None:
        assert w.producer is not None
        while True:
            if w.state.is_terminal:
                return
            if w.producer.done():
                exc = None if w.producer.cancelled() else w.producer.exception()
                if exc is not None:
                    raise exc
                if w.task is TaskKind.EVAL or not self._in_flight(w):
                    return
            elif w.task is not TaskKind.EVAL and self._failed(w) >= self.max_failures:
                w.producer.cancel()
                await asyncio.gather(w.producer, return_exceptions=True)
                errors = w.tenant.errors[-1:] if w.tenant else []
                last = f"; last: {errors[0]}" if errors else ""
                raise RuntimeError(f"{self._failed(w)} training jobs failed{last}")
            self._watch(w)
            await self.clock.sleep(max(self.ctx.poll_s, 0.02))

    def _jobs_of(self, w: _Workload) -> list[TrainingJob]:
        """The jobs this workload's producer reserved (tagged with its id)."""
        return [
            j
            for j in self.scheduler.list_jobs(tenant_id=w.tenant_id)
            if j.metadata.get("workload_id") == w.workload_id
        ]

    def _in_flight(self, w: _Workload) -> int:
        return sum(1 for j in self._jobs_of(w) if not j.is_terminal)

    def _failed(self, w: _Workload) -> int:
        """Failed jobs that count against the workload (not restarts or cancels)."""
        return sum(
            1
            for j in self._jobs_of(w)
            if j.state is JobState.FAILED and j.terminal_reason not in _NOT_THE_JOBS_FAULT
        )

    async def _finish(self, w: _Workload) -> None:
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
            tenant.metrics.write("checkpoint", policy_version=version)
            # SFT updates are served from now on. An engine the Health Manager is
            # restarting answers unavailable for a moment: the trained weights are
            # already checkpointed, so wait for it rather than fail the workload.
            await self._while_restarting(lambda: publish(self.ctx, tid))
            if w.source is not None and self.heldout_samples is not None:
                source, frames = w.source, self.heldout_samples
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
        self._save(w)
        self._write_event(w, "completed")

    async def _measure_success(self, tenant: WorkflowTenant, phase: Phase) -> None:
        """Measure and record the tenant's success rate; a failed measurement is an
        error of the workload's record, never a failed workload (its training stands)."""
        try:
            await measure_success(self.inference, tenant, phase)
        except ServiceUnavailableError:
            raise  # a role being restarted: the caller waits it out
        except JoyNexusError as error:
            log.warning("%s success rate of %s: %s", phase, tenant.tenant_id, error)
            tenant.errors.append(f"success_eval {phase}: {reason_of(error)}")

    async def _while_restarting(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, retried while a service answers unavailable (a role being
        restarted in place) for at most ``restart_grace_s``."""
        deadline = self.clock.now() + self.restart_grace_s
        while True:
            try:
                return await call()
            except ServiceUnavailableError:
                if self.clock.now() >= deadline:
                    raise
                await self.clock.sleep(max(self.poll_s, 0.1))

    # ------------------------------------------------------------ health hooks

    def _progress(self, w: _Workload) -> tuple[int, int, int]:
        jobs = self._jobs_of(w)
        done = sum(1 for j in jobs if j.is_terminal)
        evals = len(w.tenant.metrics.of_kind("eval")) if w.tenant is not None else 0
        return (done, len(jobs), evals)

    def expected_job_s(self, w: _Workload) -> float | None:
        """Mean wall time of the workload's completed jobs (None before the first)."""
        spans = [
            j.finished_at - j.created_at
            for j in self._jobs_of(w)
            if j.state is JobState.COMPLETED and j.finished_at is not None
        ]
        return sum(spans) / len(spans) if spans else None

    def _watch(self, w: _Workload) -> None:
        """The watchdog: flag a running workload that has made no progress for long."""
        mark = self._progress(w)
        now = self.clock.now()
        if mark != w.progress_mark or w.state is not WorkloadState.RUNNING:
            if w.stalled is not None and mark != w.progress_mark:
                self._write_event(w, "progressing")
            w.progress_mark, w.progress_at, w.stalled = mark, now, None
            return
        expected = self.expected_job_s(w)
        limit = max(self.watchdog_min_s, self.watchdog_factor * (expected or 0.0))
        silent = now - w.progress_at
        if w.stalled is None and silent > limit:
            w.stalled = (
                f"no progress for {silent:.0f} s (limit {limit:.0f} s = "
                f"{self.watchdog_factor:g} x expected job time "
                f"{'unknown' if expected is None else f'{expected:.1f} s'}, at least "
                f"{self.watchdog_min_s:g} s)"
            )
            log.warning("workload %s stalled: %s", w.workload_id, w.stalled)
            self._write_event(w, "stalled", reason=w.stalled)

    async def fail_live(self, reason: str) -> list[str]:
        """End every live workload ``failed`` with ``reason`` (a role that cannot be
        recovered: the Health Manager's budget is spent). Returns their ids."""
        ended = []
        for w in list(self._workloads.values()):
            if w.state.is_terminal:
                continue
            if w.supervisor is not None and not w.supervisor.done():
                w.supervisor.cancel()
                await asyncio.gather(w.supervisor, return_exceptions=True)
            await self._end_failed(w, reason[:500])
            ended.append(w.workload_id)
        return ended

    async def restart_training(self) -> None:
        """The training role's in-place restart: rebuild every live tenant's slot.

        Jobs in flight fail ``role_restarted`` (never counted against the workload);
        each trainable tenant's slot is recreated from its latest checkpoint — which
        holds every completed update — and published again; the producers go on.
        """
        async with self._training_lock:
            for w in list(self._workloads.values()):
                if w.state.is_terminal or w.task not in _TRAINABLE or w.tenant is None:
                    continue
                await self._fail_in_flight(w, ROLE_RESTARTED_REASON)
                tenant = w.tenant
                assert tenant.config is not None
                with contextlib.suppress(NotFoundError):
                    await self.training.remove_tenant(w.tenant_id)
                await self.training.add_tenant(tenant.config)
                with contextlib.suppress(NotFoundError):
                    tenant.last_checkpoint_version = await self.training.restore(w.tenant_id)
                    tenant.jobs_applied = int(
                        self.training.checkpoint_ledger(w.tenant_id).get("jobs_applied", 0)
                    )
                await publish(self.ctx, w.tenant_id)
                tenant.metrics.write(
                    "training_restarted", policy_version=tenant.last_checkpoint_version
                )

    def degraded(self) -> list[str]:
        """Why the service is not fully healthy: stalled workloads (empty when fine)."""
        return [f"workload {w.workload_id}: {w.stalled}" for w in self._live() if w.stalled]

    def _live(self) -> list[_Workload]:
        return [w for w in self._workloads.values() if not w.state.is_terminal]

    # --------------------------------------------------------------- reporting

    def session_holders(self) -> list[WorkflowTenant]:
        """The tenants of the live workloads (whose sessions the Health Manager watches)."""
        return [w.tenant for w in self._live() if w.tenant is not None]

    def workload_ids(self) -> list[str]:
        """Every workload, oldest first (operators and ``joynexus run``)."""
        return list(self._workloads)

    def tenant_owner(self, workload_id: str) -> str | None:
        """The tenant a workload belongs to (None: no such workload)."""
        w = self._workloads.get(workload_id)
        return None if w is None else w.tenant_id

    def tenant_of(self, workload_id: str) -> WorkflowTenant | None:
        """The tenant as the loops see it (None before the workload started)."""
        w = self._workloads.get(workload_id)
        return None if w is None else w.tenant

    def list_workloads(self, tenant_id: str) -> list[WorkloadStatus]:
        """The tenant's workloads, oldest first."""
        return [
            self.status(tenant_id, wid)
            for wid, w in self._workloads.items()
            if w.tenant_id == tenant_id
        ]

    def status(self, tenant_id: str, workload_id: str) -> WorkloadStatus:
        """State and progress (jobs completed/target, version) of one workload."""
        w = self._owned(tenant_id, workload_id)
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
        elif self._holds_slot(w):
            assert w.tenant is not None
            # The durable version (checkpointed, hence the only one ever served): the
            # optimizer steps of a job still training would be lost by a crash, so a
            # version shown here never goes back across a restart.
            out.policy_version = w.tenant.last_checkpoint_version
        if c.task_type is not None:
            jobs = self._jobs_of(w)
            out.jobs_completed = sum(1 for j in jobs if j.state is JobState.COMPLETED)
            out.jobs_failed = sum(1 for j in jobs if j.state is JobState.FAILED)
            out.jobs_dropped = sum(1 for j in jobs if j.state is JobState.DROPPED)
            out.jobs_in_flight = sum(1 for j in jobs if not j.is_terminal)
            out.jobs_target = c.spec.scheduling.completion_target
        return out

    def spec_of(self, tenant_id: str, workload_id: str) -> dict[str, Any]:
        """The compiled spec of a workload, as JSON data."""
        w = self._owned(tenant_id, workload_id)
        spec: dict[str, Any] = w.compiled.spec.model_dump(
            mode="json", by_alias=True, exclude={"output_dir"}
        )
        return spec

    def metrics(
        self, tenant_id: str, workload_id: str, kind: str | None = None, limit: int = 10_000
    ) -> WorkloadMetrics:
        """The workload's metrics records (newest ``limit``) and a per-kind summary."""
        w = self._owned(tenant_id, workload_id)
        path = self._workload_dir(w) / "metrics.jsonl"
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

    def tenant_dir(self, tenant_id: str) -> Path:
        """The tenant's output directory (checkpoints, workload folders)."""
        return self.output_root / tenant_id

    def artifact_root(self, tenant_id: str, workload_id: str) -> Path:
        """Where a workload's artifacts live: its tenant's output directory."""
        self._owned(tenant_id, workload_id)
        return self.tenant_dir(tenant_id)

    def _workload_dir(self, w: _Workload) -> Path:
        return self.tenant_dir(w.tenant_id) / "workloads" / w.workload_id

    def _write_manifest(self, w: _Workload) -> None:
        folder = self._workload_dir(w)
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

    def _save(self, w: _Workload) -> None:
        """Commit ``w``'s record (every state change goes through here)."""
        if w.state.is_terminal and w.final_version is None and self._holds_slot(w):
            assert w.tenant is not None
            w.final_version = w.tenant.last_checkpoint_version
        self.store.put(w.record())

    def _holds_slot(self, w: _Workload) -> bool:
        """``w`` is the workload whose tenant state the tenant's slot holds now."""
        return w.tenant is not None and self._tenants.get(w.tenant_id) is w.tenant

    def _write_event(self, w: _Workload, state: str, **extra: Any) -> None:
        with contextlib.suppress(OSError):
            MetricsLog(self._workload_dir(w) / "metrics.jsonl", self.clock).write(
                "lifecycle", state=state, **extra
            )


def _global_limits() -> list[GlobalLimit]:
    # The §5.1 bounds compile_workloads attaches to every run (same defaults).
    return [
        GlobalLimit(
            task_type=TaskType.RL,
            max_active=DEFAULT_MAX_ACTIVE_ROLLOUTS,
            max_active_per_tenant=DEFAULT_MAX_ACTIVE_ROLLOUTS_PER_TENANT,
        )
    ]
