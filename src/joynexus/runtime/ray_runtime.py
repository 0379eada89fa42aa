"""The Ray runtime: the same services as Ray actors in a layout's placement group.

:class:`RayRuntime` is a :class:`~joynexus.runtime.managed.ManagedRuntime` whose
factories return actors instead of objects. ``ray.remote(cls)`` is applied at run time
to the very classes the embedded runtime instantiates — no second copy of their logic:

* ``TrainingModelService`` in the layout's actor bundle;
* ``InferenceModelService`` rollout engines (an elastic pool) sharing the inference
  bundle, each with ``inference_gpus / max_engines`` GPUs;
* ``EnvironmentService`` in the environment bundle (its simulator workers are child
  processes of that actor);
* the Training Queue (``TrainingQueue`` over
  :class:`~joynexus.queues.ray_storage.RayObjectStorePartitionStorage`) as a CPU
  actor outside the placement group: the column chunks live in the object store, the
  actor keeps refs and the consumption index.

Every actor is reached through :class:`~joynexus.runtime.ray_proxy.ActorProxy`, so the
workflow loops run unchanged. What stays in the driver (first cut): the Training
Scheduler (SQLite; its producer / consumer leases are heartbeated by the proxies while a
remote rollout or training job runs) and the workflow loops themselves.

:func:`build_serving_plane` builds a live server's plane (``joynexus serve --runtime
ray``) with :class:`RayServingRuntime`: the same actors, one rollout engine actor, and
the Master Service and HTTP server in the driver.

Every actor receives the resident base model by reference (``ray.put`` once) and holds
its own copy in its process, as a resident service would.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from joynexus.errors import ServiceUnavailableError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.queues.ray_storage import RayObjectStorePartitionStorage
from joynexus.queues.training import TrainingQueue
from joynexus.runtime.embedded import RuntimeConfig
from joynexus.runtime.managed import ManagedRuntime
from joynexus.runtime.placement import Layout, Placement, build_placement
from joynexus.runtime.plane import ExecutionPlane, PlaneSettings, build_plane, load_base_model
from joynexus.runtime.ray_proxy import ActorProxy, await_ref
from joynexus.runtime.scaling import AutoscalePolicy, EngineHandle
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import BaseModelSpec
from joynexus.utils.clock import SystemClock

__all__ = ["RayRuntime", "RayServingRuntime", "build_serving_plane", "connect"]


def connect(address: str | None = None, **init_kwargs: Any) -> bool:
    """Attach to a Ray cluster (``address="auto"`` or ``"host:port"``) or start a local
    one (``address=None``). Returns True if this call started Ray.

    A local cluster started here gets ``RAY_AUTH_MODE=disabled`` unless the caller set
    it: it accepts connections only from this machine's processes.
    """
    import ray

    if ray.is_initialized():
        return False
    if address is None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        init_kwargs.setdefault("include_dashboard", False)
    ray.init(address=address, **init_kwargs)
    return True


def _running(svc: Any) -> bool:
    return bool(svc.inference_queue.running)


def _alive(svc: Any) -> bool:
    return True


class RayRuntime(ManagedRuntime):
    """Runs compiled workloads with the services as Ray actors (see module docstring).

    Args:
        run_dir: Scheduler database, model cache and default outputs (a path every
            actor can reach: a local cluster, or a shared file system).
        address: ``None`` starts a local Ray (if none is running in this process),
            ``"auto"`` attaches to the running cluster, or an explicit address.
        layout: ``"2-2-4"``, ``"1-1-2"``, a name in ``LAYOUTS`` or a :class:`Layout`.
        config: Runtime knobs.
        engines: Rollout engines at start (at most ``layout.engines``).
        ray_init: Extra ``ray.init`` arguments when Ray is started here.
        placement_timeout_s: How long to wait for the placement group.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        address: str | None = None,
        layout: str | Layout = "2-2-4",
        config: RuntimeConfig | None = None,
        engines: int = 1,
        ray_init: dict[str, Any] | None = None,
        placement_timeout_s: float = 60.0,
        health_check_s: float = 1.0,
        recovery_budget: int = 3,
        autoscale: AutoscalePolicy | None = None,
    ) -> None:
        self.layout = layout if isinstance(layout, Layout) else Layout.parse(layout)
        super().__init__(
            run_dir,
            config=config,
            clock=SystemClock(),  # actors cannot share a fake clock across processes
            engines=engines,
            max_engines=self.layout.engines,
            health_check_s=health_check_s,
            recovery_budget=recovery_budget,
            autoscale=autoscale,
        )
        self.address = address
        self._ray_init = dict(ray_init or {})
        self._placement_timeout_s = placement_timeout_s
        self._started_ray = False
        self.placement: Placement | None = None
        self._base_ref: Any = None
        self._env_proxy: ActorProxy | None = None
        self._training_proxy: ActorProxy | None = None
        self._queue_handle: Any = None

    # ------------------------------------------------------------------ lifecycle

    async def _before_plane(self, base: ResidentBaseModel) -> None:
        import ray

        self._started_ray = connect(self.address, **self._ray_init) or self._started_ray
        self.placement = build_placement(
            self.layout, timeout_s=self._placement_timeout_s, name=f"joynexus-{id(self):x}"
        )
        self._base_ref = ray.put(base)

    def make_queue(self, s: PlaneSettings) -> TrainingQueue:
        import ray

        self._queue_handle = (
            ray.remote(TrainingQueue)
            .options(num_cpus=0, max_concurrency=64)
            .remote(RayObjectStorePartitionStorage())
        )
        return cast(TrainingQueue, ActorProxy(self._queue_handle, TrainingQueue))

    def make_env(self, s: PlaneSettings) -> EnvironmentService:
        import ray

        assert self.placement is not None
        handle = (
            ray.remote(EnvironmentService)
            .options(max_concurrency=64, **self.placement.actor_options("environment"))
            .remote(self.config.env, clock=SystemClock())
        )
        self._env_proxy = ActorProxy(handle, EnvironmentService)
        return cast(EnvironmentService, self._env_proxy)

    def make_training(
        self, s: PlaneSettings, base: ResidentBaseModel, queue: TrainingQueue
    ) -> TrainingModelService:
        import ray

        assert self.placement is not None
        handle = (
            ray.remote(TrainingModelService)
            .options(max_concurrency=64, **self.placement.actor_options("actor"))
            .remote(
                self._base_ref,
                queue,
                output_dir=self.run_dir / "outputs",
                clock=SystemClock(),
            )
        )
        self._training_proxy = ActorProxy(handle, TrainingModelService)
        return cast(TrainingModelService, self._training_proxy)

    async def _make_engine(self, slot: int) -> EngineHandle:
        import ray

        assert self.placement is not None and self._env_proxy is not None
        handle: Any = (
            ray.remote(InferenceModelService)
            .options(max_concurrency=256, **self.placement.actor_options("inference"))
            .remote(
                self._base_ref,
                self._env_proxy,
                self.queue,
                max_batch_size=self.config.max_batch_size,
                max_wait_s=self.config.max_wait_s,
                clock=SystemClock(),
            )
        )
        engine = ActorProxy(handle, InferenceModelService)
        try:
            await engine.start()
        except BaseException:
            ray.kill(handle)
            raise

        async def release() -> None:
            ray.kill(handle)

        async def probe() -> None:
            if not await await_ref(handle.__ray_call__.remote(_running)):
                raise ServiceUnavailableError("inference engine stopped unexpectedly")

        return EngineHandle(engine=engine, release=release, probe=probe)

    def _is_engine_failure(self, error: BaseException) -> bool:
        from ray.exceptions import RayActorError

        return isinstance(error, RayActorError | ServiceUnavailableError)

    async def _probe_training(self) -> None:
        assert self._training_proxy is not None
        await await_ref(self._training_proxy.actor.__ray_call__.remote(_alive))

    async def _stop_services(self) -> None:
        # Training and queue actors stay up for the summary and inspection: close().
        await super()._stop_services()

    def kill_engine(self, engine_id: int) -> None:
        """Kill one rollout engine's actor (fault injection for tests and drills)."""
        import ray

        engine = self.pool.engine(engine_id)
        assert isinstance(engine, ActorProxy)
        ray.kill(engine.actor, no_restart=True)

    def close(self) -> None:
        """Kill the remaining actors, release the placement group, and stop Ray if this
        runtime started it."""
        import ray

        if not ray.is_initialized():
            return
        for proxy in (self._training_proxy, self._env_proxy):
            if proxy is not None:
                ray.kill(proxy.actor)
        if self._queue_handle is not None:
            ray.kill(self._queue_handle)
        self._training_proxy = self._env_proxy = self._queue_handle = None
        if self.placement is not None:
            self.placement.remove()
            self.placement = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


class RayServingRuntime(RayRuntime):
    """The Ray factory of ``joynexus serve --runtime ray``.

    Same actors as :class:`RayRuntime`, except inference: one rollout engine actor
    (its proxy, not the engine pool) that the server's lifespan starts and stops. The
    Master Service, the Training Scheduler and the HTTP server stay in the driver
    process.
    """

    _inference_handle: Any = None

    def make_inference(
        self,
        s: PlaneSettings,
        base: ResidentBaseModel,
        env: EnvironmentService,
        queue: TrainingQueue,
    ) -> InferenceModelService:
        import ray

        assert self.placement is not None
        handle = (
            ray.remote(InferenceModelService)
            .options(max_concurrency=256, **self.placement.actor_options("inference"))
            .remote(
                self._base_ref,
                env,
                queue,
                max_batch_size=self.config.max_batch_size,
                max_wait_s=self.config.max_wait_s,
                clock=SystemClock(),
            )
        )
        self._inference_handle = handle
        return cast(InferenceModelService, ActorProxy(handle, InferenceModelService))

    def close(self) -> None:
        import ray

        if self._inference_handle is not None and ray.is_initialized():
            ray.kill(self._inference_handle)
        self._inference_handle = None
        super().close()


async def build_serving_plane(
    run_dir: Path,
    base_model: BaseModelSpec,
    *,
    address: str | None = None,
    layout: str | Layout = "cpu",
    config: RuntimeConfig | None = None,
    ray_init: dict[str, Any] | None = None,
) -> tuple[ExecutionPlane, RayServingRuntime]:
    """The execution plane of a live server with the services as Ray actors.

    Attaches to Ray (``address="auto"`` / ``"host:port"``) or starts a local one
    (``None``), reserves ``layout``'s placement group and builds the plane with
    :class:`RayServingRuntime` as its factory (services not started: the server's
    lifespan starts them).

    Returns:
        The plane and the runtime; call ``runtime.close()`` after the server stopped
        (kills the actors, releases the placement group, stops a Ray started here).
    """
    import asyncio

    rt = RayServingRuntime(
        run_dir, address=address, layout=layout, config=config, ray_init=ray_init
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    base = await asyncio.to_thread(load_base_model, base_model, run_dir / "models")
    try:
        await rt._before_plane(base)
        plane = build_plane(
            run_dir, base_model, config=rt.config, clock=rt.clock, base=base, factory=rt
        )
    except BaseException:
        rt.close()
        raise
    return plane, rt
