"""The embedded runtime: the whole execution plane in one process.

:class:`EmbeddedRuntime` builds the execution plane with
:func:`~joynexus.runtime.plane.build_plane` — the resident base model, the Training
Scheduler (SQLite in the run directory, so job history survives the process), the
Training Queue, the Environment Service and the Training / Inference Model Services —
starts each tenant with :mod:`joynexus.workflows.launch`, and hosts the workflow loops
of :mod:`joynexus.workflows` as independent asyncio tasks:

* one RL producer per RL tenant and one SFT producer per SFT tenant;
* one advantage stage, one actor-forward stage (when some tenant's algorithm uses it)
  and one actor consumer, shared by every tenant;
* one evaluator per evaluation workload.

A run ends when every training tenant reached its completion target with no job left
in flight (or failed too often) and every evaluator finished its runs; the loops are
then cancelled, each tenant is checkpointed, and a :class:`RunSummary` is returned.
A tenant whose output dir already holds a checkpoint resumes from the latest one.

The runtime is its plane's :class:`~joynexus.runtime.plane.ServiceFactory`: subclasses
override its ``make_*`` methods to host the same service classes elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from joynexus.control.job import JobState
from joynexus.control.scheduler import TrainingScheduler
from joynexus.data.record import record_episodes
from joynexus.metrics.jsonl import TenantJsonlSink
from joynexus.models.backbone import ResidentBaseModel
from joynexus.queues.training import TrainingQueue
from joynexus.runtime.plane import (
    ExecutionPlane,
    RuntimeConfig,
    ServiceFactory,
    build_plane,
    load_base_model,
    new_monitoring,
)
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import TaskKind, WorkloadSpec
from joynexus.utils.clock import Clock, SystemClock
from joynexus.workflows.actor import publish
from joynexus.workflows.compile import DOMAIN, CompiledRun, CompiledWorkload, compile_workloads
from joynexus.workflows.context import MetricsLog, WorkflowContext, WorkflowTenant
from joynexus.workflows.evaluation import EvalRun
from joynexus.workflows.launch import (
    StartedTenant,
    open_session,
    start_actor_forward,
    start_producer,
    start_stage_loops,
    start_tenant,
    uses_actor_forward,
)
from joynexus.workflows.sft import SFTSource, heldout_action_error
from joynexus.workflows.summary import (
    EvalRunSummary,
    RunSummary,
    TenantProgress,
    TenantSummary,
)

__all__ = ["EmbeddedRuntime", "RuntimeConfig", "load_base_model", "record_missing_dataset"]

log = logging.getLogger(__name__)


def record_missing_dataset(
    spec: WorkloadSpec, on_episode: Callable[[int, int, bool], None] | None = None
) -> Path:
    """Record ``spec.dataset.record_episodes`` expert episodes into the missing dataset."""
    assert spec.dataset is not None and spec.env is not None
    summary = record_episodes(
        spec.env,
        spec.dataset.path,
        episodes=spec.dataset.record_episodes,
        seed=spec.seed,
        on_episode=on_episode,
    )
    return summary.root


class EmbeddedRuntime(ServiceFactory):
    """Runs compiled workloads to completion in this process (see module docstring).

    After :meth:`run` the scheduler (closed, still queryable), the queue and the
    tenants stay available for inspection.

    Args:
        run_dir: Holds ``scheduler.sqlite``, the tiny-model cache and default outputs.
        config: Runtime knobs.
        clock: Time source of every component (tests may pass their own).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        config: RuntimeConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.config = config or RuntimeConfig()
        self.clock: Clock = clock or SystemClock()
        self.scheduler: TrainingScheduler | None = None
        self.queue = TrainingQueue()
        self.training: TrainingModelService | None = None
        self.inference: InferenceModelService | None = None
        self.env: EnvironmentService | None = None
        self.tenants: dict[str, WorkflowTenant] = {}
        self.compiled: CompiledRun | None = None
        self.eval_runs: dict[str, list[EvalRun]] = {}
        self._started: dict[str, StartedTenant] = {}
        self._sources: dict[str, SFTSource] = {}
        self._heldout_initial: dict[str, float | None] = {}
        self._resumed: dict[str, int] = {}
        self._producers: dict[str, asyncio.Task[Any]] = {}
        self._evaluators: dict[str, asyncio.Task[list[EvalRun]]] = {}
        # One Metrics Service and one usage meter per runtime, shared by the three
        # services, so every run records per-tenant busy (device) seconds per service in
        # <run_dir>/usage.json. Callers may subscribe their own sinks before run().
        self.metrics_service, self.usage = new_monitoring(self.run_dir)
        self.plane: ExecutionPlane | None = None

    # ------------------------------------------------------------------ metrics

    def _start_metrics(self) -> None:
        """Subscribe the run's file sinks and start delivery.

        Events go to ``<run_dir>/metrics/<tenant>/metrics.jsonl`` (not the tenant's output
        dir, whose ``metrics.jsonl`` holds the workflow records) and learning curves to
        TensorBoard under ``<run_dir>/tensorboard``.
        """
        root = self.run_dir / "metrics"
        self.metrics_service.subscribe(
            TenantJsonlSink(root, service_path=root / "service.jsonl"), name="jsonl"
        )
        try:
            from joynexus.metrics.trackers import TensorBoardSink

            self.metrics_service.subscribe(
                TensorBoardSink(self.run_dir / "tensorboard"), name="tensorboard"
            )
        except ImportError as exc:  # tensorboard is a core dependency; a broken install
            log.warning("TensorBoard sink disabled: %s", exc)
        self.metrics_service.start()

    def _stop_metrics(self) -> None:
        self.metrics_service.stop()
        with contextlib.suppress(OSError):
            self.usage.save()

    # ------------------------------------------------------------------ progress

    def progress(self) -> list[TenantProgress]:
        """One row per tenant: completed jobs against the target, current version."""
        rows: list[TenantProgress] = []
        if self.scheduler is None or self.compiled is None:
            return rows
        by_tenant = self.scheduler.counters()["by_tenant"]
        for w in self.compiled.workloads:
            t = w.tenant_id
            if w.task is TaskKind.EVAL:
                done_runs = len(self.eval_runs.get(t, [])) or sum(
                    1 for r in self.tenants[t].metrics.records if r["kind"] == "eval"
                )
                ev = w.spec.evaluation
                assert ev is not None
                rows.append(
                    TenantProgress(
                        tenant=t,
                        task="eval",
                        completed=done_runs,
                        target=ev.runs * len(ev.targets),
                        version=None,
                        done=self._tenant_done(w),
                    )
                )
                continue
            version = self.training.policy_version(t) if self.training else None
            rows.append(
                TenantProgress(
                    tenant=t,
                    task=w.task.value,
                    completed=int(by_tenant.get(t, {}).get("completed", 0)),
                    target=w.spec.scheduling.completion_target,
                    version=version,
                    done=self._tenant_done(w),
                )
            )
        return rows

    def _tenant_done(self, w: CompiledWorkload) -> bool:
        if w.task is TaskKind.EVAL:
            task = self._evaluators.get(w.tenant_id)
            return task is not None and task.done()
        assert self.scheduler is not None
        jobs = self.scheduler.list_jobs(tenant_id=w.tenant_id)
        if any(not j.is_terminal for j in jobs):
            return False
        failed = sum(1 for j in jobs if j.state is JobState.FAILED)
        producer = self._producers.get(w.tenant_id)
        return failed >= self.config.max_failures_per_tenant or (
            producer is not None and producer.done()
        )

    # ----------------------------------------------------------------------- run

    async def run(
        self,
        specs: Sequence[WorkloadSpec] | CompiledRun,
        *,
        on_progress: Callable[[list[TenantProgress]], None] | None = None,
        on_status: Callable[[str], None] | None = None,
        on_record_episode: Callable[[str, int, int, bool], None] | None = None,
    ) -> RunSummary:
        """Compile (unless given compiled), start everything, run to completion.

        Raises:
            SpecError / DatasetError: a bad spec, before anything starts.
        """
        started = time.monotonic()
        compiled = specs if isinstance(specs, CompiledRun) else compile_workloads(list(specs))
        self.compiled = compiled
        status = on_status or (lambda _msg: None)
        for w in compiled.workloads:
            if w.needs_recording:
                assert w.spec.dataset is not None and w.spec.env is not None
                status(
                    f"{w.tenant_id}: dataset {w.spec.dataset.path} is missing; recording "
                    f"{w.spec.dataset.record_episodes} episodes of {w.spec.env.kind} with the "
                    "scripted expert"
                )
                tid = w.tenant_id
                cb = None
                if on_record_episode is not None:
                    cb = lambda ep, n, ok, tid=tid: on_record_episode(tid, ep, n, ok)  # noqa: E731
                await asyncio.to_thread(record_missing_dataset, w.spec, cb)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        status(f"loading base model {compiled.base_model.id}")
        base = await asyncio.to_thread(
            load_base_model, compiled.base_model, self.run_dir / "models"
        )
        self._start_metrics()
        try:
            await self._before_plane(base)
            self._adopt(
                build_plane(
                    self.run_dir,
                    compiled.base_model,
                    config=self.config,
                    clock=self.clock,
                    base=base,
                    metrics=self.metrics_service,
                    usage=self.usage,
                    factory=self,
                )
            )
            return await self._run(compiled, started, on_progress, status)
        finally:
            if self.scheduler is not None:
                self.scheduler.close()
            self._stop_metrics()

    async def _run(
        self,
        compiled: CompiledRun,
        started: float,
        on_progress: Callable[[list[TenantProgress]], None] | None,
        status: Callable[[str], None],
    ) -> RunSummary:
        sched = self.scheduler
        assert sched is not None
        for w in compiled.workloads:
            if w.admission is not None and w.task_type is not None:
                sched.set_policy(w.tenant_id, w.task_type, w.admission)
        for limit in compiled.global_limits:
            sched.set_global_limit(limit)
        await self._start_services()
        assert self.training is not None and self.inference is not None
        tasks: list[asyncio.Task[Any]] = []
        try:
            status("starting tenants and environment sessions")
            await self._add_tenants(compiled)
            ctx = WorkflowContext(
                scheduler=sched,
                queue=self.queue,
                training=self.training,
                inference=self.inference,
                clock=self.clock,
                tenants=self.tenants,
                domain=DOMAIN,
                poll_s=self.config.poll_s,
            )
            tasks.extend(start_stage_loops(ctx))
            if any(uses_actor_forward(w) for w in compiled.workloads):
                tasks.append(start_actor_forward(ctx))
            for w in compiled.workloads:
                task = start_producer(ctx, w, self._started[w.tenant_id])
                if w.task is TaskKind.EVAL:
                    self._evaluators[w.tenant_id] = task
                else:
                    self._producers[w.tenant_id] = task
            status("running")
            await self._wait(compiled, tasks, on_progress)
        finally:
            everything = tasks + list(self._producers.values()) + list(self._evaluators.values())
            for task in everything:
                task.cancel()
            await asyncio.gather(*everything, return_exceptions=True)
            for task in self._evaluators.values():
                if not task.cancelled() and task.exception() is None:
                    self.eval_runs[task.get_name().removeprefix("eval:")] = task.result()
            await self._close_sessions()
        try:
            status("final measurements and checkpoints")
            await self._finish(compiled)
        finally:
            await self._stop_services()
        return self._summary(compiled, time.monotonic() - started)

    async def _before_plane(self, base: ResidentBaseModel) -> None:
        """Prepare where the services will live (a hook: the Ray runtime connects to
        the cluster and reserves the placement group)."""

    def _adopt(self, plane: ExecutionPlane) -> None:
        self.plane = plane
        self.scheduler = plane.scheduler
        self.queue = plane.queue
        self.env = plane.env
        self.training = plane.training
        self.inference = plane.inference

    async def _start_services(self) -> None:
        """Start the plane's services (a hook: the managed runtime starts its engine
        pool and health monitor instead)."""
        assert self.inference is not None
        await self.inference.start()

    async def _stop_services(self) -> None:
        assert self.inference is not None and self.env is not None
        await self.inference.stop()
        await self.env.aclose()

    async def _add_tenants(self, compiled: CompiledRun) -> None:
        assert self.plane is not None
        assert self.training is not None and self.inference is not None and self.env is not None
        targets = compiled.eval_targets()
        for w in compiled.workloads:
            metrics = MetricsLog(w.spec.output_dir / w.tenant_id / "metrics.jsonl", self.clock)
            session_id = await open_session(self.env, w)
            started = await start_tenant(
                w,
                base=self.plane.base,
                training=self.training,
                inference=self.inference,
                metrics=metrics,
                session_id=session_id,
                serve=w.task is TaskKind.RL or w.tenant_id in targets,
                heldout_samples=self.config.heldout_samples,
            )
            self._started[w.tenant_id] = started
            self.tenants[w.tenant_id] = started.tenant
            if started.source is not None:
                self._sources[w.tenant_id] = started.source
                self._heldout_initial[w.tenant_id] = started.heldout_initial
            if started.resumed_from is not None:
                self._resumed[w.tenant_id] = started.resumed_from

    async def _wait(
        self,
        compiled: CompiledRun,
        loops: list[asyncio.Task[Any]],
        on_progress: Callable[[list[TenantProgress]], None] | None,
    ) -> None:
        while True:
            for task in loops:  # the shared loops never end on their own
                if task.done():
                    exc = task.exception()
                    raise RuntimeError(f"workflow loop {task.get_name()} stopped: {exc!r}")
            for tid, task in self._producers.items():
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"producer of {tid} stopped: {task.exception()!r}")
            if on_progress is not None:
                on_progress(self.progress())
            stop = True
            for w in compiled.workloads:
                if self._tenant_done(w):
                    producer = self._producers.get(w.tenant_id)
                    if producer is not None and not producer.done():
                        producer.cancel()  # too many failures: stop this tenant
                else:
                    stop = False
            if stop:
                if on_progress is not None:
                    on_progress(self.progress())
                return
            await self.clock.sleep(0.1)

    async def _close_sessions(self) -> None:
        assert self.env is not None
        for tenant in self.tenants.values():
            if tenant.session_id is not None:
                with contextlib.suppress(Exception):
                    await self.env.close(tenant.session_id, tenant_id=tenant.tenant_id)

    async def _finish(self, compiled: CompiledRun) -> None:
        assert self.training is not None and self.inference is not None
        ctx_training = self.training
        for w in compiled.workloads:
            if w.config is None:
                continue
            tenant = self.tenants[w.tenant_id]
            version = ctx_training.policy_version(w.tenant_id)
            latest = ctx_training.latest_checkpoint(w.tenant_id)
            if version > 0 and (latest is None or latest.name != f"step_{version}"):
                await ctx_training.save(version, [w.tenant_id], include_optim=True)
                tenant.metrics.write("checkpoint", policy_version=version)
            if w.task is TaskKind.SFT:
                ctx = self._publisher()
                await publish(ctx, w.tenant_id)
                err = await heldout_action_error(
                    self.inference,
                    w.tenant_id,
                    self._sources[w.tenant_id],
                    max_samples=self.config.heldout_samples,
                )
                tenant.metrics.write(
                    "heldout",
                    initial=self._heldout_initial.get(w.tenant_id),
                    final=err,
                    policy_version=version,
                )

    def _publisher(self) -> WorkflowContext:
        assert self.scheduler and self.training and self.inference
        return WorkflowContext(
            scheduler=self.scheduler,
            queue=self.queue,
            training=self.training,
            inference=self.inference,
            clock=self.clock,
            tenants=self.tenants,
        )

    def _summary(self, compiled: CompiledRun, wall_s: float) -> RunSummary:
        assert self.scheduler is not None
        counts = self.scheduler.counters()["by_tenant"]
        out: dict[str, TenantSummary] = {}
        for w in compiled.workloads:
            t = w.tenant_id
            tenant = self.tenants[t]
            c = counts.get(t, {})
            s = TenantSummary(
                task=w.task.value,
                jobs_completed=int(c.get("completed", 0)),
                jobs_dropped=int(c.get("dropped", 0)),
                jobs_failed=int(c.get("failed", 0)),
                errors=tenant.errors[:20],
                output_dir=str(w.spec.output_dir / t),
                resumed_from_version=self._resumed.get(t),
            )
            if w.config is not None and self.training is not None:
                s.final_version = self.training.policy_version(t)
            if w.task is TaskKind.SFT:
                held = tenant.metrics.of_kind("heldout")
                s.sft_heldout_error_initial = self._heldout_initial.get(t)
                s.sft_heldout_error_final = held[-1]["final"] if held else None
            elif w.task is TaskKind.RL:
                rets = [
                    r["mean_return"]
                    for r in tenant.metrics.of_kind("rollout")
                    if r.get("mean_return") is not None
                ]
                s.rl_return_initial = float(rets[0]) if rets else None
                s.rl_return_final = float(rets[-1]) if rets else None
            else:
                runs = self.eval_runs.get(t, [])
                s.eval_runs = [
                    EvalRunSummary(
                        run=r.run,
                        target=r.target,
                        version=r.version,
                        versions_seen=sorted(r.versions_seen),
                        episodes=r.episodes,
                        success_rate=r.success_rate,
                        mean_return=r.mean_return,
                    )
                    for r in runs
                ]
                if runs:
                    last = max(r.run for r in runs)
                    s.eval_success_rate = float(
                        np.mean([r.success_rate for r in runs if r.run == last])
                    )
            out[t] = s
        return RunSummary(run_dir=str(self.run_dir), wall_s=wall_s, tenants=out)
