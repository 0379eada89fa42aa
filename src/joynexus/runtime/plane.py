"""The execution plane: the long-lived services every workload of a process runs on.

One builder, :func:`build_plane`, serves every host of the plane — the Master Service,
behind HTTP (``joynexus serve``) or in process (``joynexus run``, the demo). It loads
the resident base model (or takes one already loaded), opens the durable Training
Scheduler in the run directory — failing the jobs a previous process left in flight,
unless the Master reconciles them — builds the Metrics Service and usage meter (unless
given), and has a :class:`~joynexus.runtime.hosting.Placement` build the
Training Queue and the Environment / Training / Inference Model Services where it puts
them: objects in this process (:class:`~joynexus.runtime.hosting.InProcess`), an
elastic pool of in-process rollout engines
(:class:`~joynexus.runtime.hosting.EnginePoolPlacement`) or Ray actors
(:class:`~joynexus.runtime.ray_hosting.RayPlacement`). The plane's service fields are
typed by the protocols of :mod:`joynexus.services.protocols`, which all three satisfy.

The :class:`ExecutionPlane` owns the services' lifecycle (:meth:`~ExecutionPlane.start`
/ :meth:`~ExecutionPlane.stop` / :meth:`~ExecutionPlane.close`) and rollout scaling;
:func:`watch_plane` is the one health wiring of a plane, used by every host.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from joynexus.control.integrity import check_run_dir_database
from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import ServiceUnavailableError, SpecError
from joynexus.interop.lerobot import TINY_LEROBOT, make_tiny_lerobot
from joynexus.metrics.events import MetricsService
from joynexus.metrics.prometheus import UsageCollector
from joynexus.metrics.usage import USAGE_FILE, UsageMeter
from joynexus.models.availability import known_ids
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.tiny import ARCHES, SIDECAR, make_tiny
from joynexus.runtime.health import HealthManager
from joynexus.runtime.hosting import (
    EnginePoolPlacement,
    Hosting,
    InProcess,
    Placement,
    PlaneSettings,
    RuntimeConfig,
)
from joynexus.runtime.scaling import EnginePool, EngineStatus
from joynexus.runtime.sessions import SessionRecovery
from joynexus.services.inference import InferenceModelService
from joynexus.services.protocols import (
    EnvironmentServiceAPI,
    InferenceModelServiceAPI,
    TrainingModelServiceAPI,
    TrainingQueueAPI,
)
from joynexus.spec.workload import BaseModelSpec
from joynexus.utils.clock import Clock, SystemClock
from joynexus.workflows.context import WorkflowTenant

__all__ = [
    "INFERENCE_ROLE",
    "RESTARTED_REASON",
    "TRAINING_ROLE",
    "EnginePoolPlacement",
    "ExecutionPlane",
    "InProcess",
    "Placement",
    "PlaneSettings",
    "RuntimeConfig",
    "build_plane",
    "load_base_model",
    "new_monitoring",
    "open_scheduler",
    "watch_plane",
]

#: Terminal reason of the jobs a previous process left in flight.
RESTARTED_REASON = "runtime_restarted"
#: Health role of a single in-process inference engine (a pool's are ``inference/<id>``).
INFERENCE_ROLE = "inference"
#: Health role of the Training Model Service.
TRAINING_ROLE = "training"
TINY_PREFIX = "tiny:"
#: ``small:<arch>``: the same real architecture at ``make-tiny --size small``.
SMALL_PREFIX = "small:"
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def load_base_model(spec: BaseModelSpec, cache_dir: Path) -> ResidentBaseModel:
    """Load the resident backbone a spec names.

    ``tiny:<arch>`` (``tiny:qwen2_5_vl``, ``tiny:pi0``, ...) builds a randomly initialised
    tiny model of that architecture once into ``cache_dir`` and loads it through
    :meth:`ResidentBaseModel.from_pretrained` — the same path a hub id takes;
    ``small:<arch>`` does the same at the ``small`` size. ``tiny:smolvla`` is a tiny
    LeRobot SmolVLA checkpoint (:func:`~joynexus.interop.lerobot.make_tiny_lerobot`).

    Raises:
        SpecError: an unknown tiny architecture.
    """
    import torch

    model_id = spec.id
    identity = None
    for prefix, size in ((TINY_PREFIX, "tiny"), (SMALL_PREFIX, "small")):
        if not model_id.startswith(prefix):
            continue
        arch = model_id.removeprefix(prefix)
        if arch == TINY_LEROBOT and size == "tiny":
            # A tiny LeRobot SmolVLA, built by the real lerobot (its venv) from a fixed
            # seed: the same checkpoint wherever it is materialized.
            path = cache_dir / f"{size}-{arch}"
            if not (path / "config.json").is_file():
                make_tiny_lerobot(arch, path)
            model_id, identity = str(path), spec.id
            break
        if arch not in ARCHES:
            raise SpecError(
                f"base_model.id {model_id!r}: unknown {size} architecture; allowed: "
                f"{known_ids(prefix)}",
                field="base_model.id",
            )
        path = cache_dir / f"{size}-{arch}"
        if not (path / SIDECAR).is_file():
            make_tiny(arch, path, size=size)
        # Built from a fixed seed: the same weights wherever it is materialized, so it
        # keeps the spec's id (checkpoints carry it to other run directories).
        model_id, identity = str(path), spec.id
        break
    dtype = None if spec.dtype == "auto" else getattr(torch, _TORCH_DTYPES[spec.dtype])
    return ResidentBaseModel.from_pretrained(
        model_id,
        device=spec.device,
        dtype=dtype,
        canonical_image_size=spec.canonical_image_size,
        identity=identity,
        canonicalizer=spec.canonicalizer,
    )


@dataclass
class ExecutionPlane:
    """The long-lived services one process hosts every workload on.

    Attributes:
        base / base_model_id: The resident base model and the id it was loaded from.
        scheduler: The durable Training Scheduler (in this process).
        queue / env / training / inference: The services, wherever they live;
            ``inference`` is the engine pool when the placement has one.
        hosting: Where they live and how to start, stop and release them.
        metrics / usage: The Metrics Service and usage meter the in-process services
            report to.
    """

    base: ResidentBaseModel
    base_model_id: str
    scheduler: TrainingScheduler
    queue: TrainingQueueAPI
    env: EnvironmentServiceAPI
    training: TrainingModelServiceAPI
    inference: InferenceModelServiceAPI
    hosting: Hosting
    metrics: MetricsService | None = None
    usage: UsageMeter | None = None

    @property
    def pool(self) -> EnginePool | None:
        """The rollout-engine pool behind ``inference`` (None: one engine)."""
        return self.hosting.pool

    async def start(self) -> None:
        """Start the inference engine(s); the other services need no start."""
        await self.hosting.start()

    async def stop(self) -> None:
        """Stop the inference engine(s) and close every environment session."""
        await self.hosting.stop()

    def close(self) -> None:
        """Release what the placement reserved (Ray actors, placement group, a Ray
        started for it) and close the scheduler; after :meth:`stop`."""
        try:
            self.hosting.close()
        finally:
            self.scheduler.close()

    async def scale_rollout(self, n: int) -> int:
        """Scale the rollout-engine pool to ``n`` engines (draining the leaving ones);
        returns the new size. See :meth:`Hosting.scale_rollout`.

        Raises:
            ConflictError: the placement has no engine pool (``InProcess``).
        """
        return await self.hosting.scale_rollout(n)

    def engine_status(self) -> list[EngineStatus]:
        """The pool's engines.

        Raises:
            ConflictError: the placement has no engine pool (``InProcess``).
        """
        return self.hosting.engine_status()


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


def open_scheduler(
    run_dir: Path, config: RuntimeConfig, clock: Clock, *, keep_in_flight: bool = False
) -> TrainingScheduler:
    """Open the durable Training Scheduler in ``<run_dir>/scheduler.sqlite``.

    Jobs another process left in flight lost their partitions with that process (the
    Training Queue lives in memory): they are failed ``runtime_restarted`` instead of
    being waited for forever — unless ``keep_in_flight``, for a caller that reconciles
    them itself (the Master, against its checkpoint ledgers).

    Raises:
        RunDirStateError: the database is missing or empty while checkpoints or workload
            records exist, or it fails SQLite's integrity check.
    """
    # A missing, empty or damaged database next to existing checkpoints is refused
    # here, before opening it would create an empty one over them.
    check_run_dir_database(run_dir)
    scheduler = TrainingScheduler.open(
        run_dir / "scheduler.sqlite",
        clock=clock,
        lease_ttl_s=config.lease_ttl_s,
        producer_lease_ttl_s=config.producer_lease_ttl_s,
    )
    for job in [] if keep_in_flight else scheduler.list_jobs():
        if not job.is_terminal:
            scheduler.fail(job.job_id, RESTARTED_REASON)
    return scheduler


def build_plane(
    run_dir: Path,
    base_model: BaseModelSpec,
    *,
    placement: Placement = InProcess(),
    config: RuntimeConfig | None = None,
    clock: Clock | None = None,
    base: ResidentBaseModel | None = None,
    metrics: MetricsService | None = None,
    usage: UsageMeter | None = None,
    keep_in_flight: bool = False,
) -> ExecutionPlane:
    """Load the base model and place the services (not started yet).

    Jobs a previous process left in flight are failed ``runtime_restarted`` (their
    partitions lived in that process's memory), unless ``keep_in_flight``.

    Args:
        run_dir: Holds ``scheduler.sqlite``, ``usage.json``, the tiny-model cache and
            the default outputs; created if missing.
        base_model: The resident backbone to load (unless ``base`` is given).
        placement: Where the services live (default: objects in this process, one
            inference engine).
        config: Plane knobs.
        clock: Time source of every in-process service and the scheduler.
        base: An already loaded base model (a runtime loads it off the event loop).
        metrics / usage: The Metrics Service and usage meter the services report to;
            when neither is given, new ones (:func:`new_monitoring`, resuming
            ``usage.json``).
        keep_in_flight: Leave the jobs a previous process left in flight to the caller
            (the Master reconciles them with its checkpoint ledgers).

    Raises:
        SpecError: an unknown tiny architecture.
        CapacityError / ServiceUnavailableError: the placement cannot reserve what it
            needs (the scheduler is closed again).
    """
    cfg = config or RuntimeConfig()
    clk = clock or SystemClock()
    run_dir.mkdir(parents=True, exist_ok=True)
    if base is None:
        base = load_base_model(base_model, run_dir / "models")
    if metrics is None and usage is None:
        metrics, usage = new_monitoring(run_dir, clk)
    inference_base = None
    if cfg.inference_backbone == "copy" and isinstance(placement, InProcess | EnginePoolPlacement):
        # The inference role's own resident copy: loaded as a separate process would.
        inference_base = load_base_model(base_model, run_dir / "models")
    scheduler = open_scheduler(run_dir, cfg, clk, keep_in_flight=keep_in_flight)
    try:
        settings = PlaneSettings(
            run_dir,
            cfg,
            clk,
            metrics,
            usage,
            base_model=base_model,
            inference_base=inference_base,
        )
        hosting = placement.place(settings, base)
    except BaseException:
        scheduler.close()
        raise
    return ExecutionPlane(
        base=base,
        base_model_id=base_model.id,
        scheduler=scheduler,
        queue=hosting.queue,
        env=hosting.env,
        training=hosting.training,
        inference=hosting.inference,
        hosting=hosting,
        metrics=metrics,
        usage=usage,
    )


def watch_plane(
    health: HealthManager,
    plane: ExecutionPlane,
    *,
    session_holders: Callable[[], Iterable[WorkflowTenant]],
    restart_training: Callable[[], Awaitable[None]] | None = None,
    fail_holder: Callable[[WorkflowTenant, str], Awaitable[object]] | None = None,
) -> SessionRecovery:
    """Register the plane's restartable roles with ``health`` (call once per plane).

    * ``environment``: a crashed simulator session is closed and recreated with the
      same spec for the tenant that holds it, within that tenant's own budget
      (:class:`~joynexus.runtime.sessions.SessionRecovery`; past it ``fail_holder``
      ends that tenant's workload, never anyone else's);
    * inference: with an engine pool, one ``inference/<id>`` role per engine, kept in
      step with scaling; a failed engine (probe, or a call that found it dead) is
      replaced in place — under Ray by a new actor — and synced to every tenant's
      latest published weights, which the pool records. With one in-process engine,
      an ``inference`` role whose restart stops and starts its Inference Queue
      (tenant slots and weights live in the service and survive);
    * ``training``: probed (under Ray: the actor is alive); its restart is
      ``restart_training`` when given (e.g. rebuild the training slots from their
      checkpoints), otherwise any failure escalates to a global restart, since
      optimizer state cannot be rebuilt in place. Under Ray the ``training_queue``
      actor escalates the same way (its partitions are lost with it).

    Args:
        health: The Health Manager to register with (its owner runs it).
        plane: The plane to watch (before or after :meth:`ExecutionPlane.start`).
        session_holders: Lists the tenants that may hold a simulator session now.
        restart_training: Redeploys the training role; None: escalate instead.
        fail_holder: Fails the workload of a tenant whose session budget is spent.

    Returns:
        The environment role's session recovery.

    Raises:
        ConflictError: a role is already registered (the plane is watched already).
    """
    sessions = SessionRecovery(plane.env, session_holders, health, on_exhausted=fail_holder)
    sessions.register()
    pool = plane.pool
    if pool is not None:
        _watch_pool(health, pool)
    elif isinstance(plane.inference, InferenceModelService):
        _watch_engine(health, plane.inference)
    for role, probe in plane.hosting.probes().items():
        if role == TRAINING_ROLE and restart_training is not None:
            health.register(role, restart_training, probe=probe)
        else:
            health.register(
                role, functools.partial(_cannot_restart, role), probe=probe, shared=True
            )
    return sessions


async def _cannot_restart(role: str) -> None:
    # Never called: a shared role escalates instead of restarting.
    raise ServiceUnavailableError(f"the {role} role cannot be restarted in place")


def _watch_engine(health: HealthManager, engine: InferenceModelService) -> None:
    async def probe() -> None:
        if not engine.inference_queue.running:
            raise ServiceUnavailableError("the inference queue worker stopped unexpectedly")

    async def restart() -> None:
        await engine.stop()
        await engine.start()

    health.register(INFERENCE_ROLE, restart, probe=probe)


def _watch_pool(health: HealthManager, pool: EnginePool) -> None:
    prefix = f"{INFERENCE_ROLE}/"

    def sync_roles() -> None:
        live = {f"{prefix}{i}" for i in pool.engine_ids()}
        for role in health.roles():
            if role.startswith(prefix) and role not in live:
                health.unregister(role)
        registered = set(health.roles())
        for engine_id in pool.engine_ids():
            if f"{prefix}{engine_id}" not in registered:
                health.register(
                    f"{prefix}{engine_id}",
                    functools.partial(pool.restart_engine, engine_id),
                    probe=functools.partial(_probe_engine, pool, engine_id),
                )

    async def report(engine_id: int, error: BaseException) -> None:
        role = f"{prefix}{engine_id}"
        if role in health.roles():
            await health.report_error(role, error)

    pool.on_engine_failure = report
    pool.on_resize = sync_roles
    sync_roles()


async def _probe_engine(pool: EnginePool, engine_id: int) -> None:
    probe = pool.handle(engine_id).probe
    if probe is not None:
        await probe()
