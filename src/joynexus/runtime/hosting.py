"""Where the services of an execution plane live: placements.

A :class:`Placement` describes where one plane's services run (frozen: it can be
reused and passed as a default); :meth:`Placement.place` builds them there and returns
their :class:`Hosting`: the Training Queue and the three services typed by their
protocols (:mod:`joynexus.services.protocols`), and what starting, stopping and
releasing them takes. :func:`~joynexus.runtime.plane.build_plane` is the only caller.

* :class:`InProcess`: every service an object in this process; one inference engine.
* :class:`EnginePoolPlacement`: the same objects, but inference goes through an
  :class:`~joynexus.runtime.scaling.EnginePool` of in-process engines (elastic scale
  out / in with weight sync on admission, an engine restarted in place by the health
  wiring).
* :class:`~joynexus.runtime.ray_hosting.RayPlacement`: the same classes as Ray actors
  in a layout's placement group, inference through an engine pool of actors.

Placements only place services; what runs on them (the Master Service, a runtime's
workflow loops) and who watches them (:func:`~joynexus.runtime.plane.watch_plane`) is
decided elsewhere.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from joynexus.errors import ConflictError, InvalidRequestError, ServiceUnavailableError
from joynexus.metrics.events import MetricsService
from joynexus.metrics.usage import UsageMeter
from joynexus.models.backbone import ResidentBaseModel
from joynexus.queues.training import TrainingQueue
from joynexus.runtime.autoscale import AutoscalePolicy, Autoscaler
from joynexus.runtime.scaling import EngineHandle, EnginePool, EngineStatus
from joynexus.services.environment import EnvironmentService, EnvironmentServiceConfig
from joynexus.services.inference import InferenceModelService
from joynexus.services.protocols import (
    EnvironmentServiceAPI,
    InferenceModelServiceAPI,
    TrainingModelServiceAPI,
    TrainingQueueAPI,
)
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import BaseModelSpec
from joynexus.utils.clock import Clock

__all__ = [
    "EnginePoolPlacement",
    "Hosting",
    "InProcess",
    "Placement",
    "PlaneSettings",
    "Probe",
    "RuntimeConfig",
    "check_engines",
    "new_environment",
    "new_inference",
    "new_training",
]

#: A liveness check: returns when the role is alive, raises otherwise.
Probe = Callable[[], Awaitable[None]]


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
        tenant_batch_rows: The most rows of one tenant in one grouped batch (a larger
            predict runs as pieces of this many rows); None: ``max_batch_size``.
        predict_deadline_s: Longest a predict may wait in the Inference Queue
            (504 ``deadline_exceeded`` after it); None: no limit.
        watchdog_factor / watchdog_min_s: The Master flags a running workload
            ``stalled`` after this many expected job times without progress (never
            before ``watchdog_min_s`` seconds).
        queue_memory_cap_bytes: Bound of the Training Queue's memory (None: none).
        tenant_memory_budget_bytes: Bytes all tenants' trainable state (heads, LoRA
            adapters, optimizer state) may take; a tenant that does not fit is refused
            (None: no bound).
        env: Environment Service limits.
        inference_backbone: ``"shared"`` (default): the Inference Model Service runs on
            the training role's resident backbone, and the two roles take turns on its
            one lock; ``"copy"``: in-process placements load a second resident copy for
            inference, with its own lock, so a training step never blocks a predict
            (the paper's separate services; costs one more backbone of memory). Ray
            placements always load one per role.
    """

    lease_ttl_s: float = 120.0
    producer_lease_ttl_s: float = 300.0
    poll_s: float = 0.05
    max_failures_per_tenant: int = 5
    heldout_samples: int = 64
    max_batch_size: int = 128
    max_wait_s: float = 0.005
    tenant_batch_rows: int | None = None
    predict_deadline_s: float | None = 60.0
    watchdog_factor: float = 20.0
    watchdog_min_s: float = 120.0
    queue_memory_cap_bytes: int | None = None
    tenant_memory_budget_bytes: int | None = None
    env: EnvironmentServiceConfig = field(default_factory=EnvironmentServiceConfig)
    inference_backbone: Literal["shared", "copy"] = "shared"


@dataclass
class PlaneSettings:
    """What every service of a plane is built with.

    ``base_model`` is the spec the resident backbone was loaded from: a placement
    whose services live in other processes (Ray) has each of them load it there.
    ``inference_base`` is the inference role's own resident copy
    (``RuntimeConfig.inference_backbone == "copy"``); None: it shares the plane's.
    """

    run_dir: Path
    config: RuntimeConfig
    clock: Clock
    metrics: MetricsService | None = None
    usage: UsageMeter | None = None
    base_model: BaseModelSpec | None = None
    inference_base: ResidentBaseModel | None = None


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
        tenant_memory_budget=s.config.tenant_memory_budget_bytes,
    )


def new_inference(
    s: PlaneSettings,
    base: ResidentBaseModel,
    env: EnvironmentService,
    queue: TrainingQueue,
) -> InferenceModelService:
    """An Inference Model Service (one rollout engine) in this process, not started;
    on the settings' own inference copy of the backbone when there is one."""
    return InferenceModelService(
        s.inference_base if s.inference_base is not None else base,
        env,
        queue,
        max_batch_size=s.config.max_batch_size,
        max_wait_s=s.config.max_wait_s,
        request_deadline_s=s.config.predict_deadline_s,
        tenant_batch_rows=s.config.tenant_batch_rows,
        clock=s.clock,
        metrics=s.metrics,
        usage=s.usage,
    )


async def _in_process_alive() -> None:
    """Liveness of a role that lives in this process: it cannot die on its own."""


class Hosting:
    """The services a placement built, and their lifecycle.

    Args:
        queue / env / training / inference: The placed services (``inference`` is
            ``pool`` when there is one).
        pool: The rollout-engine pool behind ``inference`` (None: one engine).
        engines: Engines the pool starts with.
        autoscale: Pressure-driven pool sizing, run between :meth:`start` and
            :meth:`stop` when enabled.
        clock: The autoscaler's clock.
    """

    def __init__(
        self,
        *,
        queue: TrainingQueueAPI,
        env: EnvironmentServiceAPI,
        training: TrainingModelServiceAPI,
        inference: InferenceModelServiceAPI,
        pool: EnginePool | None = None,
        engines: int = 1,
        autoscale: AutoscalePolicy | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.queue = queue
        self.env = env
        self.training = training
        self.inference = inference
        self.pool = pool
        self.engines = engines
        self.autoscaler = (
            Autoscaler(pool, autoscale, clock or pool.clock)
            if pool is not None and autoscale is not None and autoscale.enabled
            else None
        )
        self._autoscaling: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the inference engine(s) (and the autoscaler, when enabled)."""
        if self.pool is None:
            await self.inference.start()
            return
        await self.pool.start(self.engines)
        if self.autoscaler is not None:
            self._autoscaling = asyncio.create_task(self.autoscaler.run(), name="autoscale")

    async def stop(self) -> None:
        """Stop the inference engine(s) and close the Environment Service's sessions."""
        if self._autoscaling is not None:
            self._autoscaling.cancel()
            await asyncio.gather(self._autoscaling, return_exceptions=True)
            self._autoscaling = None
        try:
            await self.inference.stop()  # the pool stops and releases every engine
        finally:
            await self.env.aclose()

    def close(self) -> None:
        """Release what the placement reserved beyond the services (nothing here)."""

    def probes(self) -> dict[str, Probe]:
        """Liveness probes of the shared roles (``training``; under Ray also
        ``training_queue``), for the health wiring."""
        return {"training": _in_process_alive}

    async def scale_rollout(self, n: int) -> int:
        """Scale the rollout-engine pool to ``n`` engines; returns the new size.

        Scaling in drains: a leaving engine takes no new call and is released once its
        outstanding calls finished.

        Raises:
            ConflictError: this placement has no engine pool.
            InvalidRequestError / CapacityError / ServiceUnavailableError /
                DeadlineExceededError: see :meth:`EnginePool.scale_to` (rolled back).
        """
        return await self._require_pool().scale_to(n)

    def engine_status(self) -> list[EngineStatus]:
        """The pool's engines.

        Raises:
            ConflictError: this placement has no engine pool.
        """
        return self._require_pool().status()

    def _require_pool(self) -> EnginePool:
        if self.pool is None:
            raise ConflictError(
                "this plane serves inference with one in-process engine (placement "
                "InProcess); build it with EnginePoolPlacement or RayPlacement to scale "
                "rollout engines"
            )
        return self.pool


class Placement(ABC):
    """Where a plane's services live (see module docstring)."""

    @abstractmethod
    def place(self, settings: PlaneSettings, base: ResidentBaseModel) -> Hosting:
        """Build the Training Queue and the three services there (not started).

        Raises:
            CapacityError / ServiceUnavailableError: the resources cannot be had
                (nothing stays reserved).
        """


def check_engines(engines: int, max_engines: int | None) -> None:
    """Validate a pool's starting size.

    Raises:
        InvalidRequestError: ``engines`` < 1 or above ``max_engines``.
    """
    if engines < 1:
        raise InvalidRequestError(f"a rollout pool starts with at least 1 engine, got {engines}")
    if max_engines is not None and engines > max_engines:
        raise InvalidRequestError(
            f"engines={engines} is more than max_engines={max_engines}", field="engines"
        )


@dataclass(frozen=True)
class InProcess(Placement):
    """Every service an object in this process, inference by one engine."""

    def place(self, settings: PlaneSettings, base: ResidentBaseModel) -> Hosting:
        queue = TrainingQueue(memory_cap_bytes=settings.config.queue_memory_cap_bytes)
        env = new_environment(settings)
        return Hosting(
            queue=queue,
            env=env,
            training=new_training(settings, base, queue),
            inference=new_inference(settings, base, env, queue),
        )


@dataclass(frozen=True)
class EnginePoolPlacement(Placement):
    """Every service an object in this process, inference by an elastic engine pool.

    Each engine is its own Inference Model Service (own Inference Queue and batcher)
    over the one resident backbone.

    Attributes:
        engines: Engines at start.
        max_engines: Upper bound of the pool (None: unbounded).
        autoscale: Optional pressure-driven pool sizing (off by default).

    Raises:
        InvalidRequestError: ``engines`` < 1 or above ``max_engines``.
    """

    engines: int = 1
    max_engines: int | None = None
    autoscale: AutoscalePolicy | None = None

    def __post_init__(self) -> None:
        check_engines(self.engines, self.max_engines)

    def place(self, settings: PlaneSettings, base: ResidentBaseModel) -> Hosting:
        queue = TrainingQueue(memory_cap_bytes=settings.config.queue_memory_cap_bytes)
        env = new_environment(settings)

        async def make_engine(slot: int) -> EngineHandle:
            engine = new_inference(settings, base, env, queue)
            await engine.start()

            async def probe() -> None:
                if not engine.inference_queue.running:
                    raise ServiceUnavailableError("inference engine stopped unexpectedly")

            return EngineHandle(engine=engine, probe=probe)

        pool = EnginePool(make_engine, clock=settings.clock, max_engines=self.max_engines)
        return Hosting(
            queue=queue,
            env=env,
            training=new_training(settings, base, queue),
            inference=pool,
            pool=pool,
            engines=self.engines,
            autoscale=self.autoscale,
            clock=settings.clock,
        )
