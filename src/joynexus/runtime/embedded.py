"""The embedded runtime: the whole execution plane in one process.

:class:`EmbeddedRuntime` builds the resident base model, the Training Scheduler (SQLite
in the run directory, so job history survives the process), the Training Queue, the
Environment Service and the Training / Inference Model Services, then hosts the
workflow loops of :mod:`joynexus.workflows` as independent asyncio tasks:

* one RL producer per RL tenant and one SFT producer per SFT tenant;
* one advantage stage, one actor-forward stage (when some tenant's algorithm uses it)
  and one actor consumer, shared by every tenant;
* one evaluator per evaluation workload.

A run ends when every training tenant reached its completion target with no job left
in flight (or failed too often) and every evaluator finished its runs; the loops are
then cancelled, each tenant is checkpointed, and a :class:`RunSummary` is returned.
A tenant whose output dir already holds a checkpoint resumes from the latest one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from joynexus.control.job import JobState
from joynexus.control.scheduler import TrainingScheduler
from joynexus.data.record import record_episodes
from joynexus.errors import NotFoundError, SpecError
from joynexus.metrics.events import MetricsService
from joynexus.metrics.jsonl import TenantJsonlSink
from joynexus.metrics.usage import USAGE_FILE, UsageMeter
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.tiny import ARCHES, SIDECAR, make_tiny
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService, EnvironmentServiceConfig
from joynexus.services.inference import InferenceModelService
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import BaseModelSpec, TaskKind, WorkloadSpec
from joynexus.utils.clock import Clock, SystemClock
from joynexus.workflows.actor import actor_consumer, publish
from joynexus.workflows.compile import DOMAIN, CompiledRun, CompiledWorkload, compile_workloads
from joynexus.workflows.context import MetricsLog, WorkflowContext, WorkflowTenant
from joynexus.workflows.evaluation import EvalRun, evaluator
from joynexus.workflows.rl import rl_producer
from joynexus.workflows.sft import (
    SFTSource,
    heldout_action_error,
    sft_producer,
    with_normalization,
)
from joynexus.workflows.stages import actor_forward_stage, advantage_stage
from joynexus.workflows.summary import (
    EvalRunSummary,
    RunSummary,
    TenantProgress,
    TenantSummary,
)

__all__ = ["EmbeddedRuntime", "RuntimeConfig", "load_base_model", "record_missing_dataset"]

log = logging.getLogger(__name__)

TINY_PREFIX = "tiny:"
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def load_base_model(spec: BaseModelSpec, cache_dir: Path) -> ResidentBaseModel:
    """Load the resident backbone a spec names.

    ``tiny:<arch>`` (``tiny:qwen2_5_vl``, ...) builds a randomly initialised tiny model of
    that architecture once into ``cache_dir`` and loads it through
    :meth:`ResidentBaseModel.from_pretrained` — the same path a hub id takes.

    Raises:
        SpecError: an unknown tiny architecture.
    """
    import torch

    model_id = spec.id
    if model_id.startswith(TINY_PREFIX):
        arch = model_id.removeprefix(TINY_PREFIX)
        if arch not in ARCHES:
            raise SpecError(
                f"base_model.id {model_id!r}: unknown tiny architecture; allowed: "
                f"{[TINY_PREFIX + a for a in ARCHES]}",
                field="base_model.id",
            )
        path = cache_dir / f"tiny-{arch}"
        if not (path / SIDECAR).is_file():
            make_tiny(arch, path)
        model_id = str(path)
    dtype = None if spec.dtype == "auto" else getattr(torch, _TORCH_DTYPES[spec.dtype])
    return ResidentBaseModel.from_pretrained(
        model_id,
        device=spec.device,
        dtype=dtype,
        canonical_image_size=spec.canonical_image_size,
    )


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


@dataclass
class RuntimeConfig:
    """Knobs of the embedded runtime (defaults suit a CPU run).

    Attributes:
        lease_ttl_s: Stage / consumer lease lifetime between heartbeats.
        producer_lease_ttl_s: Producer lease lifetime between rollout heartbeats.
        poll_s: Back-off of producers and stages when there is nothing to do.
        max_failures_per_tenant: A tenant with this many failed jobs stops producing.
        heldout_samples: Held-out frames used to measure SFT action error.
        max_batch_size / max_wait_s: Inference Queue group batching.
        env: Environment Service limits.
    """

    lease_ttl_s: float = 120.0
    producer_lease_ttl_s: float = 300.0
    poll_s: float = 0.05
    max_failures_per_tenant: int = 5
    heldout_samples: int = 64
    max_batch_size: int = 128
    max_wait_s: float = 0.005
    env: EnvironmentServiceConfig = field(default_factory=EnvironmentServiceConfig)


class EmbeddedRuntime:
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
        self._sources: dict[str, SFTSource] = {}
        self._heldout_initial: dict[str, float | None] = {}
        self._resumed: dict[str, int] = {}
        self._producers: dict[str, asyncio.Task[None]] = {}
        self._evaluators: dict[str, asyncio.Task[list[EvalRun]]] = {}
        # One Metrics Service and one usage meter per runtime, shared by the three
        # services, so every run records per-tenant busy (device) seconds per service in
        # <run_dir>/usage.json. Callers may subscribe their own sinks before run().
        self.metrics_service = MetricsService()
        self.usage = UsageMeter(self.run_dir / USAGE_FILE, resume=True)

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
        self.scheduler = TrainingScheduler.open(
            self.run_dir / "scheduler.sqlite",
            clock=self.clock,
            lease_ttl_s=self.config.lease_ttl_s,
            producer_lease_ttl_s=self.config.producer_lease_ttl_s,
        )
        self._start_metrics()
        try:
            return await self._run(compiled, base, started, on_progress, status)
        finally:
            self.scheduler.close()
            self._stop_metrics()

    async def _run(
        self,
        compiled: CompiledRun,
        base: ResidentBaseModel,
        started: float,
        on_progress: Callable[[list[TenantProgress]], None] | None,
        status: Callable[[str], None],
    ) -> RunSummary:
        sched = self.scheduler
        assert sched is not None
        self._recover(sched)
        for w in compiled.workloads:
            if w.admission is not None and w.task_type is not None:
                sched.set_policy(w.tenant_id, w.task_type, w.admission)
        for limit in compiled.global_limits:
            sched.set_global_limit(limit)
        await self._start_services(base)
        assert self.training is not None and self.inference is not None
        tasks: list[asyncio.Task[Any]] = []
        try:
            status("starting tenants and environment sessions")
            await self._add_tenants(compiled, base)
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
            tasks.append(asyncio.create_task(actor_consumer(ctx), name="actor"))
            tasks.append(asyncio.create_task(advantage_stage(ctx), name="advantages"))
            if any(
                w.config is not None and w.task is TaskKind.RL and w.config.algorithm.actor_forward
                for w in compiled.workloads
            ):
                tasks.append(asyncio.create_task(actor_forward_stage(ctx), name="actor_forward"))
            for w in compiled.workloads:
                tenant = self.tenants[w.tenant_id]
                if w.task is TaskKind.RL:
                    self._producers[w.tenant_id] = asyncio.create_task(
                        rl_producer(ctx, tenant), name=f"rl:{w.tenant_id}"
                    )
                elif w.task is TaskKind.SFT:
                    self._producers[w.tenant_id] = asyncio.create_task(
                        sft_producer(ctx, tenant, self._sources[w.tenant_id]),
                        name=f"sft:{w.tenant_id}",
                    )
                else:
                    self._evaluators[w.tenant_id] = asyncio.create_task(
                        evaluator(ctx, tenant), name=f"eval:{w.tenant_id}"
                    )
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

    async def _start_services(self, base: ResidentBaseModel) -> None:
        """Build and start the execution-plane services (a hook: the Ray runtime hosts
        the same classes as actors instead)."""
        self.env = EnvironmentService(
            self.config.env, clock=self.clock, metrics=self.metrics_service, usage=self.usage
        )
        self.training = TrainingModelService(
            base,
            self.queue,
            output_dir=self.run_dir / "outputs",
            clock=self.clock,
            metrics=self.metrics_service,
            usage=self.usage,
        )
        self.inference = InferenceModelService(
            base,
            self.env,
            self.queue,
            max_batch_size=self.config.max_batch_size,
            max_wait_s=self.config.max_wait_s,
            clock=self.clock,
            metrics=self.metrics_service,
            usage=self.usage,
        )
        await self.inference.start()

    async def _stop_services(self) -> None:
        assert self.inference is not None and self.env is not None
        await self.inference.stop()
        await self.env.aclose()

    def _recover(self, sched: TrainingScheduler) -> None:
        # Jobs another process left in flight lost their partitions with that process
        # (the Training Queue lives in memory): fail them instead of waiting forever.
        for job in sched.list_jobs():
            if not job.is_terminal:
                sched.fail(job.job_id, "runtime_restarted")

    async def _add_tenants(self, compiled: CompiledRun, base: ResidentBaseModel) -> None:
        assert self.training is not None and self.inference is not None and self.env is not None
        targets = compiled.eval_targets()
        for w in compiled.workloads:
            out = w.spec.output_dir / w.tenant_id
            metrics = MetricsLog(out / "metrics.jsonl", self.clock)
            session_id: str | None = None
            if w.spec.env is not None and w.task is not TaskKind.SFT:
                session = await self.env.create_session(w.tenant_id, w.spec.env)
                session_id = session.session_id
            if w.config is None:
                self.tenants[w.tenant_id] = WorkflowTenant(
                    spec=w.spec,
                    schema=w.schema,
                    schema_signature=base.signature_for(w.schema),
                    config=None,
                    metrics=metrics,
                    session_id=session_id,
                    serve=False,
                )
                continue
            config = w.config
            if w.task is TaskKind.SFT:  # the dataset's normalization becomes the tenant's
                source = await asyncio.to_thread(SFTSource.open, w.spec, w.schema)
                self._sources[w.tenant_id] = source
                config = with_normalization(config, source)
            info = await self.training.add_tenant(config)
            version = 0
            with contextlib.suppress(NotFoundError):
                version = await self.training.restore(w.tenant_id)
                self._resumed[w.tenant_id] = version
            payload = await self.training.export_params(w.tenant_id)
            await self.inference.add_tenant(config, payload)
            tenant = WorkflowTenant(
                spec=w.spec,
                schema=w.schema,
                schema_signature=info.schema_signature,
                config=config,
                metrics=metrics,
                session_id=session_id,
                serve=w.task is TaskKind.RL or w.tenant_id in targets,
                last_checkpoint_version=version,
            )
            self.tenants[w.tenant_id] = tenant
            if w.tenant_id in self._resumed:
                metrics.write("resumed", policy_version=version)
            if w.task is TaskKind.SFT:
                self._heldout_initial[w.tenant_id] = await heldout_action_error(
                    self.inference,
                    w.tenant_id,
                    self._sources[w.tenant_id],
                    max_samples=self.config.heldout_samples,
                )

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
