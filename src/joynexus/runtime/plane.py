"""The execution plane: the long-lived services every workload of a process runs on.

One builder, :func:`build_plane`, serves both hosts of the plane: the live server
(``joynexus serve``, around a Master Service) and the runtimes that run compiled
workloads to completion (embedded, managed, Ray). It loads the resident base model (or
takes one already loaded), opens the durable Training Scheduler in the run directory —
failing the jobs a previous process left in flight — and builds the Training Queue and
the Environment / Training / Inference Model Services reporting to one Metrics Service
and one usage meter. The services are built, not started.

Where the services live is the :class:`ServiceFactory`'s business: the default builds
them as objects in this process; the managed runtime serves inference through an engine
pool and the Ray runtime returns actor proxies of the very same classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import SpecError
from joynexus.metrics.events import MetricsService
from joynexus.metrics.prometheus import UsageCollector
from joynexus.metrics.usage import USAGE_FILE, UsageMeter
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.tiny import ARCHES, SIDECAR, make_tiny
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService, EnvironmentServiceConfig
from joynexus.services.inference import InferenceModelService
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import BaseModelSpec
from joynexus.utils.clock import Clock, SystemClock

__all__ = [
    "RESTARTED_REASON",
    "ExecutionPlane",
    "PlaneSettings",
    "RuntimeConfig",
    "ServiceFactory",
    "build_plane",
    "load_base_model",
    "new_environment",
    "new_inference",
    "new_monitoring",
    "new_training",
    "open_scheduler",
]

#: Terminal reason of the jobs a previous process left in flight.
RESTARTED_REASON = "runtime_restarted"
TINY_PREFIX = "tiny:"
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


@dataclass
class RuntimeConfig:
    """Knobs of the execution plane and its loops (defaults suit a CPU run).

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


@dataclass
class ExecutionPlane:
    """The long-lived services one process hosts every workload on."""

    base: ResidentBaseModel
    base_model_id: str
    scheduler: TrainingScheduler
    queue: TrainingQueue
    env: EnvironmentService
    training: TrainingModelService
    inference: InferenceModelService
    metrics: MetricsService | None = None
    usage: UsageMeter | None = None


@dataclass
class PlaneSettings:
    """What every service of a plane is built with."""

    run_dir: Path
    config: RuntimeConfig
    clock: Clock
    metrics: MetricsService | None = None
    usage: UsageMeter | None = None


def new_monitoring(run_dir: Path, clock: Clock | None = None) -> tuple[MetricsService, UsageMeter]:
    """A Metrics Service and a usage meter on ``<run_dir>/usage.json``.

    The meter resumes the totals a previous process left there; its counters are
    exported through the Metrics Service's Prometheus registry.
    """
    metrics = MetricsService()
    usage = UsageMeter(run_dir / USAGE_FILE, clock=clock, resume=True)
    assert metrics.prometheus is not None
    metrics.prometheus.registry.register(UsageCollector(usage))
    return metrics, usage


def open_scheduler(run_dir: Path, config: RuntimeConfig, clock: Clock) -> TrainingScheduler:
    """Open the durable Training Scheduler in ``<run_dir>/scheduler.sqlite``.

    Jobs another process left in flight lost their partitions with that process (the
    Training Queue lives in memory): they are failed ``runtime_restarted`` instead of
    being waited for forever.
    """
    scheduler = TrainingScheduler.open(
        run_dir / "scheduler.sqlite",
        clock=clock,
        lease_ttl_s=config.lease_ttl_s,
        producer_lease_ttl_s=config.producer_lease_ttl_s,
    )
    for job in scheduler.list_jobs():
        if not job.is_terminal:
            scheduler.fail(job.job_id, RESTARTED_REASON)
    return scheduler


def new_environment(s: PlaneSettings) -> EnvironmentService:
    """An Environment Service in this process."""
    return EnvironmentService(s.config.env, clock=s.clock, metrics=s.metrics, usage=s.usage)


def new_training(
    s: PlaneSettings, base: ResidentBaseModel, queue: TrainingQueue
) -> TrainingModelService:
    """A Training Model Service in this process, writing under ``<run_dir>/outputs``."""
    return TrainingModelService(
        base,
        queue,
        output_dir=s.run_dir / "outputs",
        clock=s.clock,
        metrics=s.metrics,
        usage=s.usage,
    )


def new_inference(
    s: PlaneSettings,
    base: ResidentBaseModel,
    env: EnvironmentService,
    queue: TrainingQueue,
) -> InferenceModelService:
    """An Inference Model Service (one rollout engine) in this process, not started."""
    return InferenceModelService(
        base,
        env,
        queue,
        max_batch_size=s.config.max_batch_size,
        max_wait_s=s.config.max_wait_s,
        clock=s.clock,
        metrics=s.metrics,
        usage=s.usage,
    )


class ServiceFactory:
    """Builds a plane's services as objects in this process.

    Runtimes override methods to host the same classes elsewhere (an engine pool, Ray
    actors); what they return must offer the service's interface.
    """

    def make_queue(self, s: PlaneSettings) -> TrainingQueue:
        return TrainingQueue()

    def make_env(self, s: PlaneSettings) -> EnvironmentService:
        return new_environment(s)

    def make_training(
        self, s: PlaneSettings, base: ResidentBaseModel, queue: TrainingQueue
    ) -> TrainingModelService:
        return new_training(s, base, queue)

    def make_inference(
        self,
        s: PlaneSettings,
        base: ResidentBaseModel,
        env: EnvironmentService,
        queue: TrainingQueue,
    ) -> InferenceModelService:
        return new_inference(s, base, env, queue)


def build_plane(
    run_dir: Path,
    base_model: BaseModelSpec,
    *,
    config: RuntimeConfig | None = None,
    clock: Clock | None = None,
    base: ResidentBaseModel | None = None,
    metrics: MetricsService | None = None,
    usage: UsageMeter | None = None,
    factory: ServiceFactory | None = None,
) -> ExecutionPlane:
    """Load the base model and build the services (not started yet).

    Jobs a previous process left in flight are failed ``runtime_restarted``: their
    partitions lived in that process's memory.

    Args:
        run_dir: Holds ``scheduler.sqlite``, ``usage.json``, the tiny-model cache and
            the default outputs; created if missing.
        base_model: The resident backbone to load (unless ``base`` is given).
        config: Plane knobs.
        clock: Time source of every service.
        base: An already loaded base model (a runtime loads it off the event loop).
        metrics / usage: The Metrics Service and usage meter the services report to;
            when neither is given, new ones (:func:`new_monitoring`, resuming
            ``usage.json``).
        factory: Where the services live (default: objects in this process).
    """
    cfg = config or RuntimeConfig()
    clk = clock or SystemClock()
    run_dir.mkdir(parents=True, exist_ok=True)
    if base is None:
        base = load_base_model(base_model, run_dir / "models")
    if metrics is None and usage is None:
        metrics, usage = new_monitoring(run_dir, clk)
    make = factory or ServiceFactory()
    settings = PlaneSettings(run_dir, cfg, clk, metrics, usage)
    scheduler = open_scheduler(run_dir, cfg, clk)
    try:
        queue = make.make_queue(settings)
        env = make.make_env(settings)
        training = make.make_training(settings, base, queue)
        inference = make.make_inference(settings, base, env, queue)
    except BaseException:
        scheduler.close()
        raise
    return ExecutionPlane(
        base, base_model.id, scheduler, queue, env, training, inference, metrics, usage
    )
