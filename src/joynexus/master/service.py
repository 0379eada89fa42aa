"""The Master Service (paper §4.1.1): tenant creator and workload orchestrator.

One Master hosts workloads on ONE long-lived execution plane (resident base model,
Training Scheduler, Training Queue, Environment / Training / Inference Model Services),
so tenants submit, pause, resume and cancel workloads at any time:

* **Tenant creator** (:meth:`MasterService.compile`): strict validation of a
  :class:`WorkloadSpec` against what this backend can do — the resident base model, the
  registered environment kinds, the dataset roots, the server's limits, the backbone's
  camera slots — through :func:`joynexus.workflows.compile.compile_workloads`; derives
  the deterministic schema signature and the backend configuration (tenant config,
  admission policy).
* **Workload orchestrator**: RL connects rollout + inference + environment + training
  (:func:`~joynexus.workflows.rl.rl_producer` on the tenant's session); SFT connects a
  data producer to training (:func:`~joynexus.workflows.sft.sft_producer`); evaluation
  reuses inference + environment with no optimization path
  (:func:`~joynexus.workflows.evaluation.evaluator`); custom creates only the tenant's
  slot, which the tenant drives through the low-level primitives. One actor consumer,
  one advantage stage and (on demand) one actor-forward stage serve every tenant. The
  steps that start a tenant are :mod:`joynexus.workflows.launch`'s, shared with the
  runtimes.

Pausing sets the tenant's admission to ``max_in_flight = 0``: the unchanged producer
loop is refused and backs off, jobs already in flight finish, and resuming restores
the policy. Cancelling stops the producer, fails every non-terminal job of the tenant
with reason ``cancelled`` (clearing its partition), closes the sessions and releases
the tenant's training and serving slots.

Workload records live in memory (a restart forgets them; checkpoints, metrics and the
workload manifest stay in the tenant's output directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from joynexus.control.admission import AdmissionPolicy, GlobalLimit
from joynexus.control.job import JobState, TaskType
from joynexus.master.primitives import ModelPrimitives
from joynexus.control.scheduler import TrainingScheduler
from joynexus.api import WorkloadMetrics, WorkloadState, WorkloadStatus
from joynexus.master.limits import MasterLimits
from joynexus.errors import (
    ConflictError,
    JoyNexusError,
    NotFoundError,
    PermissionDeniedError,
    SpecError,
)
from joynexus.models.backbone import ResidentBaseModel
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import TaskKind, WorkloadSpec
from joynexus.utils.clock import Clock, SystemClock
from joynexus.workflows import launch
from joynexus.workflows.actor import publish
from joynexus.workflows.compile import (
    DEFAULT_MAX_ACTIVE_ROLLOUTS,
    DEFAULT_MAX_ACTIVE_ROLLOUTS_PER_TENANT,
    DOMAIN,
    CompiledWorkload,
    compile_workloads,
)
from joynexus.workflows.context import MetricsLog, WorkflowContext, WorkflowTenant

__all__ = ["CANCELLED_REASON", "MasterService"]

log = logging.getLogger(__name__)

#: Terminal reason of the jobs a cancelled workload leaves in flight.
CANCELLED_REASON = "cancelled"
_TRAINABLE = (TaskKind.RL, TaskKind.SFT, TaskKind.CUSTOM)


@dataclass
class _Workload:
    workload_id: str
    compiled: CompiledWorkload
    created_at: float
    state: WorkloadState = WorkloadState.STARTING
    tenant: WorkflowTenant | None = None
    admission: AdmissionPolicy | None = None
    completed_before: int = 0
    producer: asyncio.Task[Any] | None = None
    supervisor: asyncio.Task[None] | None = None
    finished_at: float | None = None
    error: str | None = None
    eval_runs: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tenant_id(self) -> str:
        return self.compiled.tenant_id

    @property
    def task(self) -> TaskKind:
        return self.compiled.task


class MasterService(ModelPrimitives):
    """Hosts workloads of many tenants on one set of services (see module docstring).

    Args:
        base: The resident base model.
        scheduler: The Training Scheduler.
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
    """

    def __init__(
        self,
        *,
        base: ResidentBaseModel,
        base_model_id: str,
        scheduler: TrainingScheduler,
        queue: TrainingQueue,
        env: EnvironmentService,
        training: TrainingModelService,
        inference: InferenceModelService,
        output_root: Path,
        limits: MasterLimits | None = None,
        clock: Clock | None = None,
        poll_s: float = 0.05,
        max_failures: int = 5,
    ) -> None:
        self.base = base
        self.base_model_id = base_model_id
        self.scheduler = scheduler
        self.queue = queue
        self.env = env
        self.training = training
        self.inference = inference
        self.output_root = Path(output_root)
        self.limits = limits or MasterLimits()
        self.clock: Clock = clock or SystemClock()
        self.max_failures = max_failures
        self._tenants: dict[str, WorkflowTenant] = {}  # trainable tenants with a slot
        self._workloads: dict[str, _Workload] = {}
        self._seq = itertools.count(1)
        self._loops: list[asyncio.Task[None]] = []
        self._actor_forward: asyncio.Task[None] | None = None
        self.ctx = WorkflowContext(
            scheduler=scheduler,
            queue=queue,
            training=training,
            inference=inference,
            clock=self.clock,
            tenants=self._tenants,
            domain=DOMAIN,
            poll_s=poll_s,
        )

    # ------------------------------------------------------------------ lifetime

    async def start(self) -> None:
        """Start the shared loops (actor consumer, advantage stage) and global limits."""
        if self._loops:
            return
        for limit in _global_limits():
            self.scheduler.set_global_limit(limit)
        self._loops = launch.start_stage_loops(self.ctx, prefix="master:")

    async def aclose(self) -> None:
        """Cancel every live workload and stop the shared loops."""
        for w in list(self._workloads.values()):
            if not w.state.is_terminal:
                with contextlib.suppress(Exception):
                    await self._cancel(w)
        loops = [*self._loops, *([self._actor_forward] if self._actor_forward else [])]
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        self._loops = []
        self._actor_forward = None

    # ------------------------------------------------------------ tenant creator

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
        self._check_limits(spec)
        if spec.evaluation is not None:
            others = sorted(set(spec.evaluation.targets) - {tenant_id})
            if others:
                raise PermissionDeniedError(
                    f"evaluation.targets {others} are other tenants; a tenant evaluates only "
                    f"its own policy ({tenant_id!r})",
                    field="evaluation.targets",
                )
        served = {t: wt.schema for t, wt in self._tenants.items() if t == tenant_id}
        compiled = compile_workloads(
            [spec], allow_custom=True, served=served, require_completion_target=False
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
        return compiled

    def _check_limits(self, spec: WorkloadSpec) -> None:
        lim = self.limits
        problems: list[tuple[str, str]] = []
        if spec.base_model.id != self.base_model_id:
            problems.append(
                (
                    "base_model.id",
                    f"{spec.base_model.id!r} is not resident here; allowed: "
                    f"[{self.base_model_id!r}]",
                )
            )
        checks: list[tuple[str, int | None, int]] = [
            ("algorithm.horizon", spec.algorithm.horizon, lim.max_horizon),
            ("algorithm.microbatch_size", spec.algorithm.microbatch_size, lim.max_microbatch_size),
            ("algorithm.samples_per_job", spec.algorithm.samples_per_job, lim.max_samples_per_job),
            (
                "scheduling.completion_target",
                spec.scheduling.completion_target,
                lim.max_completion_target,
            ),
        ]
        if spec.env is not None:
            checks.append(("env.num_envs", spec.env.num_envs, lim.max_num_envs))
            checks.append(("env.image_size", spec.env.image_size, lim.max_image_size))
            if spec.env.kind in lim.denied_env_kinds:
                problems.append(
                    (
                        "env.kind",
                        f"{spec.env.kind!r} is not available on this server (denied kinds: "
                        f"{lim.denied_env_kinds})",
                    )
                )
        if spec.evaluation is not None:
            checks.append(("evaluation.episodes", spec.evaluation.episodes, lim.max_eval_episodes))
        for name, value, limit in checks:
            if value is not None and value > limit:
                problems.append((name, f"{value} exceeds this server's limit of {limit}"))
        if spec.dataset is not None:
            path = spec.dataset.path.resolve()
            roots = [r.resolve() for r in lim.dataset_roots]
            if not any(path.is_relative_to(r) for r in roots):
                problems.append(
                    (
                        "dataset.path",
                        f"{spec.dataset.path} is outside the dataset roots of this server; "
                        f"allowed roots: {[str(r) for r in roots]}",
                    )
                )
        if problems:
            raise SpecError(
                "the workload spec exceeds what this server allows:\n"
                + "\n".join(f"  {f}: {m}" for f, m in problems),
                fields=[f for f, _ in problems],
                problems={f: m for f, m in problems},
            )

    # ---------------------------------------------------------------- lifecycle

    async def submit(self, spec: WorkloadSpec, tenant_id: str) -> WorkloadStatus:
        """Validate, compile and start a workload; answers at once (state ``starting``).

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
        elif compiled.task is TaskKind.EVAL and tenant_id not in self._tenants:
            raise ConflictError(
                f"tenant {tenant_id!r} has no policy to evaluate yet; submit an rl, sft or "
                "custom workload first",
                field="evaluation.targets",
            )
        wid = f"wl-{next(self._seq)}-{secrets.token_hex(4)}"
        w = _Workload(wid, compiled, self.clock.wall())
        self._workloads[wid] = w
        self._write_manifest(w)
        w.supervisor = asyncio.create_task(self._supervise(w), name=f"master:{wid}")
        return self.status(tenant_id, wid)

    def _owned(self, tenant_id: str, workload_id: str) -> _Workload:
        w = self._workloads.get(workload_id)
        if w is None:
            raise NotFoundError(f"no workload {workload_id!r}", workload_id=workload_id)
        if w.tenant_id != tenant_id:
            raise PermissionDeniedError(
                f"workload {workload_id!r} belongs to another tenant", workload_id=workload_id
            )
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
        assert w.admission is not None and w.compiled.task_type is not None
        paused = w.admission.model_copy(update={"max_in_flight": 0})
        self.scheduler.set_policy(tenant_id, w.compiled.task_type, paused)
        w.state = WorkloadState.PAUSED
        self._write_event(w, "paused")
        return self.status(tenant_id, workload_id)

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
        self._write_event(w, "resumed")
        return self.status(tenant_id, workload_id)

    async def cancel(self, tenant_id: str, workload_id: str) -> WorkloadStatus:
        """Stop a workload and release what it holds (a finished one is left as it is)."""
        w = self._owned(tenant_id, workload_id)
        if not w.state.is_terminal:
            await self._cancel(w)
        return self.status(tenant_id, workload_id)

    async def _cancel(self, w: _Workload) -> None:
        w.state = WorkloadState.CANCELLED
        w.finished_at = self.clock.wall()
        tasks = [t for t in (w.producer, w.supervisor) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        tid = w.tenant_id
        if w.task in _TRAINABLE:
            for job in self.scheduler.list_jobs(tenant_id=tid):
                if job.is_terminal:
                    continue
                await self.queue.async_clear(job.partition_id)
                with contextlib.suppress(JoyNexusError):
                    self.scheduler.fail(job.job_id, CANCELLED_REASON)
        await self._close_sessions(w)
        if w.task in _TRAINABLE:
            await self._release_slot(tid)
        self._write_event(w, "cancelled")

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
            if w.state is WorkloadState.STARTING:
                w.state = WorkloadState.RUNNING
            self._write_event(w, "running")
            if w.task is TaskKind.CUSTOM:
                return  # endpoints only: it runs until the tenant cancels it
            await self._wait_done(w)
            await self._finish(w)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("workload %s failed: %s", w.workload_id, error)
            w.error = str(error).splitlines()[0][:500] if str(error) else type(error).__name__
            w.state = WorkloadState.FAILED
            w.finished_at = self.clock.wall()
            if w.producer is not None:
                w.producer.cancel()
            await self._close_sessions(w)
            self._write_event(w, "failed", error=w.error)

    async def _launch(self, w: _Workload) -> None:
        c, tid = w.compiled, w.tenant_id
        spec = c.spec
        if c.needs_recording:
            from joynexus.runtime.embedded import record_missing_dataset

            await asyncio.to_thread(record_missing_dataset, spec)
        session_id = await launch.open_session(self.env, c)
        metrics = MetricsLog(self._workload_dir(w) / "metrics.jsonl", self.clock)
        if c.config is not None and (tid in self._tenants or tid in self.training.tenant_ids()):
            await self._release_slot(tid)  # a finished workload's slot: rebuilt below
        started = await launch.start_tenant(
            c,
            base=self.base,
            training=self.training,
            inference=self.inference,
            metrics=metrics,
            session_id=session_id,
            serve=True,
            skip_incompatible_checkpoint=True,  # another interface's checkpoint: fresh
        )
        w.tenant = started.tenant
        if c.config is None:  # evaluation: read-only, no slot of its own
            w.producer = launch.start_producer(self.ctx, c, started)
            return
        self._tenants[tid] = started.tenant
        if c.task is TaskKind.CUSTOM:
            return
        assert c.admission is not None and c.task_type is not None
        done_before = self._completed(tid, c.task_type)
        target = c.admission.completion_target
        w.completed_before = done_before
        w.admission = c.admission.model_copy(
            update={"completion_target": None if target is None else done_before + target}
        )
        self.scheduler.set_policy(tid, c.task_type, w.admission)
        if launch.uses_actor_forward(c) and self._actor_forward is None:
            self._actor_forward = launch.start_actor_forward(self.ctx, prefix="master:")
        w.producer = launch.start_producer(self.ctx, c, started)

    def _completed(self, tenant_id: str, task_type: TaskType) -> int:
        jobs = self.scheduler.list_jobs(tenant_id=tenant_id, state=JobState.COMPLETED)
        return sum(1 for j in jobs if j.task_type is task_type)

    async def _wait_done(self, w: _Workload) -> None:
        assert w.producer is not None
        while True:
            if w.producer.done():
                exc = None if w.producer.cancelled() else w.producer.exception()
                if exc is not None:
                    raise exc
                if w.task is TaskKind.EVAL or not self._in_flight(w):
                    return
            elif w.task is not TaskKind.EVAL and self._failed(w) >= self.max_failures:
                w.producer.cancel()
                await asyncio.gather(w.producer, return_exceptions=True)
                raise RuntimeError(f"{self._failed(w)} training jobs failed; see the metrics")
            await self.clock.sleep(max(self.ctx.poll_s, 0.02))

    def _in_flight(self, w: _Workload) -> int:
        return sum(1 for j in self.scheduler.list_jobs(tenant_id=w.tenant_id) if not j.is_terminal)

    def _jobs_since(self, w: _Workload) -> list[Any]:
        return [
            j
            for j in self.scheduler.list_jobs(tenant_id=w.tenant_id)
            if j.created_at >= w.created_at
        ]

    def _failed(self, w: _Workload) -> int:
        return sum(1 for j in self._jobs_since(w) if j.state is JobState.FAILED)

    async def _finish(self, w: _Workload) -> None:
        tid, tenant = w.tenant_id, w.tenant
        assert tenant is not None
        if w.task is TaskKind.EVAL:
            assert w.producer is not None
            w.eval_runs = len(w.producer.result())
        else:
            version = self.training.policy_version(tid)
            latest = self.training.latest_checkpoint(tid)
            if version > 0 and (latest is None or latest.name != f"step_{version}"):
                await self.training.save(version, [tid], include_optim=True)
                tenant.metrics.write("checkpoint", policy_version=version)
            await publish(self.ctx, tid)  # SFT updates are served from now on
        if tenant.session_id is not None:
            with contextlib.suppress(JoyNexusError):
                await self.env.close(tenant.session_id, tenant_id=tid)
        w.state = WorkloadState.COMPLETED
        w.finished_at = self.clock.wall()
        self._write_event(w, "completed")

    # --------------------------------------------------------------- reporting

    def session_holders(self) -> list[WorkflowTenant]:
        """The tenants of the live workloads (whose sessions the Health Manager watches)."""
        return [
            w.tenant
            for w in self._workloads.values()
            if w.tenant is not None and not w.state.is_terminal
        ]

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
        )
        if c.task is TaskKind.EVAL:
            ev = c.spec.evaluation
            assert ev is not None
            out.eval_runs_target = ev.runs * len(ev.targets)
            out.eval_runs_completed = w.eval_runs or (
                len(w.tenant.metrics.of_kind("eval")) if w.tenant else 0
            )
            return out
        if w.tenant is not None and self._tenants.get(w.tenant_id) is w.tenant:
            with contextlib.suppress(NotFoundError):
                out.policy_version = self.training.policy_version(w.tenant_id)
        if c.task_type is not None:
            jobs = self._jobs_since(w)
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
