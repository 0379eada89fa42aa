"""The services of a plane as Ray actors in a layout's placement group.

:class:`RayPlacement` applies ``ray.remote`` at run time to the very classes the
in-process placements instantiate — no second copy of their logic:

* ``TrainingModelService`` in the layout's actor bundle;
* ``InferenceModelService`` rollout engines behind an
  :class:`~joynexus.runtime.scaling.EnginePool` in the driver, sharing the inference
  bundle, each with ``inference_gpus / max_engines`` GPUs (the pool records every
  tenant's published weights, so a restarted or added engine actor is synced to them);
* ``EnvironmentService`` in the environment bundle (its simulator workers are child
  processes of that actor);
* the Training Queue (``TrainingQueue`` over
  :class:`~joynexus.queues.ray_storage.RayObjectStorePartitionStorage`) as a CPU actor
  outside the placement group: the column chunks live in the object store, the actor
  keeps refs and the consumption index.

Every actor is reached through :class:`~joynexus.runtime.ray_proxy.ActorProxy`, so
whatever runs on the plane (the Master Service, a runtime's workflow loops) runs
unchanged in the driver, with the Training Scheduler (SQLite; its leases are
heartbeated by the proxies while a remote rollout or training job runs).

Across nodes: the layout's bundles go where the placement strategy puts them (``PACK``
by default; ``SPREAD`` / ``STRICT_SPREAD`` put the roles on different nodes), and
``role_resources`` pins a role's bundle to the nodes that advertise a custom resource
(``{"actor": "trainer"}`` → only nodes started with ``--resources '{"trainer": 1}'``).
Every model actor loads the resident backbone itself, on its own node, from the model
path the plane was built from (:class:`~joynexus.runtime.ray_actors.BaseModelSource`; a
tiny model is built once into the run directory, which the nodes must see; a hub id is
fetched by each node) — nothing is shipped from the driver. The Training Queue actor is
pinned to the driver's node, so the loss of a worker node never takes the queue's index
with it; its columns are objects in the node's store, and a worker reading a microbatch
pulls them into its own node's store. The actors keep their own ``SystemClock`` (a fake
clock cannot be shared across processes) and report to no Metrics Service of the driver;
each meters its work in a usage meter of its own, which the hosting drains into the
plane's meter every ``usage_interval_s`` and on stop, so usage counts work wherever it
ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from joynexus.api import UsageReport
from joynexus.errors import ServiceUnavailableError, SpecError
from joynexus.metrics.usage import UsageMeter
from joynexus.models.backbone import ResidentBaseModel
from joynexus.queues.ray_storage import RayObjectStorePartitionStorage
from joynexus.queues.training import TrainingQueue
from joynexus.runtime.autoscale import AutoscalePolicy
from joynexus.runtime.hosting import Hosting, Placement, PlaneSettings, Probe, check_engines
from joynexus.runtime.placement import (
    ROLES,
    Layout,
    ReservedGroup,
    Role,
    Strategy,
    build_placement,
)
from joynexus.runtime.ranks import DataParallelRole
from joynexus.runtime.ray_actors import (
    BaseModelSource,
    actor_class,
    connect,
    drain_usage,
    engine_running,
    is_engine_failure,
    node_of,
    queue_alive,
    rendezvous,
    spec_of,
    when_up,
)
from joynexus.runtime.ray_proxy import ActorProxy, await_ref
from joynexus.runtime.scaling import EngineHandle, EnginePool
from joynexus.services.data_parallel import DataParallelTrainingService, RankGroup
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.protocols import TrainingModelServiceAPI
from joynexus.services.training import TrainingModelService
from joynexus.utils.clock import SystemClock

log = logging.getLogger(__name__)

__all__ = ["BaseModelSource", "RayHosting", "RayPlacement", "connect", "node_of"]


@dataclass
class _Reserved:
    """What a Ray placement holds beyond the driver: actors, the group, Ray itself."""

    started_ray: bool = False
    group: ReservedGroup | None = None
    actors: list[Any] = field(default_factory=list)

    def release(self) -> None:
        import ray

        if not ray.is_initialized():
            return
        for handle in self.actors:
            ray.kill(handle)
        self.actors = []
        if self.group is not None:
            self.group.remove()
            self.group = None
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


class RayHosting(Hosting):
    """The Ray actors of a plane (see module docstring); built by :class:`RayPlacement`.

    :meth:`stop` stops the engine actors (the pool releases them) and closes the
    environment actor's sessions; the training, environment and queue actors stay up
    for inspection until :meth:`close`.
    """

    def __init__(
        self,
        reserved: _Reserved,
        *,
        queue: ActorProxy[TrainingQueue],
        env: ActorProxy[EnvironmentService],
        training: TrainingModelServiceAPI,
        training_ranks: list[ActorProxy[TrainingModelService]],
        pool: EnginePool,
        engines: int,
        autoscale: AutoscalePolicy | None,
        usage: UsageMeter | None = None,
        usage_interval_s: float = 2.0,
    ) -> None:
        super().__init__(
            queue=queue,
            env=env,
            training=training,
            inference=pool,
            pool=pool,
            engines=engines,
            autoscale=autoscale,
        )
        self.reserved = reserved
        self.training_ranks = training_ranks
        self.queue_proxy = queue
        self.usage = usage
        self.usage_interval_s = usage_interval_s
        self._incarnations: dict[int, tuple[str, int]] = {}
        self._metering: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the engines, then move the actors' usage into the plane's meter every
        ``usage_interval_s``."""
        await super().start()
        if self.usage is not None:
            self._metering = asyncio.create_task(self._meter(), name="actor-usage")

    async def stop(self) -> None:
        """Collect the actors' last usage, then stop as :meth:`Hosting.stop`."""
        if self._metering is not None:
            self._metering.cancel()
            await asyncio.gather(self._metering, return_exceptions=True)
            self._metering = None
        with contextlib.suppress(Exception):
            await self.collect_usage()
        await super().stop()

    async def _meter(self) -> None:
        while True:
            await asyncio.sleep(self.usage_interval_s)
            try:
                await self.collect_usage()
            except Exception as error:  # metering never stops the plane; next round retries
                log.warning("collecting actor usage failed: %s", error)

    async def collect_usage(self) -> int:
        """Drain every live actor's usage meter into the plane's (training ranks,
        environment, rollout engines); returns how many actors answered. An actor that
        died since the last collection takes its last interval's counts with it."""
        if self.usage is None:
            return 0
        proxies: list[ActorProxy[Any]] = [*self.training_ranks]
        if isinstance(self.env, ActorProxy):
            proxies.append(self.env)
        if self.pool is not None:
            proxies += [
                e
                for i in self.pool.engine_ids()
                if isinstance(e := self.pool.engine(i), ActorProxy)
            ]
        reports = await asyncio.gather(
            *(await_ref(p.actor.__ray_call__.remote(drain_usage)) for p in proxies),
            return_exceptions=True,
        )
        answered = 0
        for report in reports:
            if isinstance(report, UsageReport):
                self.usage.merge(report)
                answered += 1
        return answered

    @property
    def group(self) -> ReservedGroup | None:
        """The reserved placement group (None once closed)."""
        return self.reserved.group

    def probes(self) -> dict[str, Probe]:
        async def training() -> None:
            for i, rank in enumerate(self.training_ranks):
                now = await when_up(rank)
                seen = self._incarnations.setdefault(i, now)
                if now != seen:
                    # Ray re-created the actor (its node was lost): it is alive but
                    # holds no tenant slots; the role's restart rebuilds them.
                    self._incarnations[i] = now
                    raise ServiceUnavailableError(
                        f"training rank {i} was re-created on node {now[0][:8]} after its "
                        "node was lost; its tenant slots must be rebuilt"
                    )

        async def training_queue() -> None:
            await await_ref(self.queue_proxy.actor.__ray_call__.remote(queue_alive))

        return {"training": training, "training_queue": training_queue}

    def role_nodes(self) -> dict[str, str]:
        """Node id of every actor: ``training`` (rank 0; ``training/<rank>`` for the
        others of a data-parallel role), ``environment``, ``training_queue`` and
        ``inference/<engine id>``."""
        out = {
            "training": node_of(self.training_ranks[0]),
            **{f"training/{i}": node_of(r) for i, r in enumerate(self.training_ranks) if i},
            "environment": node_of(self.env),  # type: ignore[arg-type]  # an ActorProxy
            "training_queue": node_of(self.queue_proxy),
        }
        if self.pool is not None:
            for engine_id in self.pool.engine_ids():
                engine = self.pool.engine(engine_id)
                if isinstance(engine, ActorProxy):
                    out[f"inference/{engine_id}"] = node_of(engine)
        return out

    def waiting_for(self) -> list[str]:
        """Why a role cannot run now: each bundle of the layout that has no node (its
        node was lost and no live node can hold it), with what it needs. Empty when
        every role is placed. Its actors wait (a restarted engine or rank is created
        when a node that fits joins); an operator adds capacity or ends the run."""
        from ray.util import placement_group_table

        group = self.reserved.group
        if group is None:
            return []
        table: dict[str, Any] = placement_group_table(group.group)
        placed: dict[int, str] = table.get("bundles_to_node_id") or {}
        bundles: dict[int, dict[str, float]] = table.get("bundles") or {}
        return [
            f"role {role}: its bundle {bundles.get(i, {})} has no node; waiting for a live "
            f"node that can hold it (placement group {table.get('state')}, strategy "
            f"{table.get('strategy')})"
            for i, role in enumerate(ROLES)
            if not placed.get(i)
        ]

    def kill_engine(self, engine_id: int) -> None:
        """Kill one rollout engine's actor (fault injection for tests and drills)."""
        import ray

        assert self.pool is not None
        engine = self.pool.engine(engine_id)
        assert isinstance(engine, ActorProxy)
        ray.kill(engine.actor, no_restart=True)

    def close(self) -> None:
        """Kill the remaining actors, release the placement group, and stop Ray if this
        placement started it."""
        self.reserved.release()


@dataclass(frozen=True)
class RayPlacement(Placement):
    """The services as Ray actors in a layout's placement group (see module docstring).

    Attributes:
        address: ``None`` starts a local Ray (if none is running in this process),
            ``"auto"`` attaches to the running cluster, or an explicit address.
        layout: ``"2-2-4"``, ``"1-1-2"``, a name in ``LAYOUTS`` or a :class:`Layout`.
        engines: Rollout engines at start.
        max_engines: Upper bound of the pool (default: the layout's, one engine per
            inference GPU); the inference bundle is shared evenly among that many.
        ray_init: Extra ``ray.init`` arguments when Ray is started here.
        placement_timeout_s: How long to wait for the placement group.
        autoscale: Optional pressure-driven pool sizing (off by default).
        strategy: How the layout's bundles spread over nodes (``PACK``: as few nodes
            as possible; ``SPREAD``: over as many as possible; ``STRICT_SPREAD``: one
            role per node, or the group is not placed).
        role_resources: A custom node resource per role: the role's bundle asks for
            a sliver of it, so it is placed only on nodes that advertise it.
        training_ranks: Data-parallel ranks of the training role (1: one Training
            Model Service); the ranks share the actor bundle and its GPUs, one GPU
            or more each.

    Raises:
        SpecError: an unknown layout.
        InvalidRequestError: ``engines`` < 1 or above the pool's bound.
    """

    address: str | None = None
    layout: str | Layout = "2-2-4"
    engines: int = 1
    max_engines: int | None = None
    ray_init: Mapping[str, Any] | None = None
    placement_timeout_s: float = 60.0
    autoscale: AutoscalePolicy | None = None
    strategy: Strategy = "PACK"
    role_resources: Mapping[Role, str] | None = None
    training_ranks: int = 1

    def __post_init__(self) -> None:
        layout = self.resolved_layout()
        check_engines(self.engines, layout.engines)
        if self.training_ranks < 1 or (
            layout.actor_gpus > 0 and layout.actor_gpus / self.training_ranks < 1
        ):
            raise SpecError(
                f"training_ranks={self.training_ranks}: expected at least 1, and at most "
                f"one rank per actor GPU (layout {layout} has {layout.actor_gpus:g})",
                field="training_ranks",
            )

    def resolved_layout(self) -> Layout:
        """The layout, with ``max_engines`` applied."""
        layout = self.layout if isinstance(self.layout, Layout) else Layout.parse(self.layout)
        if self.max_engines is not None:
            layout = layout.model_copy(update={"max_engines": self.max_engines})
        return layout

    def place(self, settings: PlaneSettings, base: ResidentBaseModel) -> RayHosting:
        """Connect to Ray, reserve the layout's group and create the actors.

        Raises:
            CapacityError: the cluster cannot place the layout in time (nothing stays
                reserved, and a Ray started here is stopped).
        """
        reserved = _Reserved(started_ray=connect(self.address, **dict(self.ray_init or {})))
        try:
            return self._place(settings, base, reserved)
        except BaseException:
            reserved.release()
            raise

    def _place(
        self, settings: PlaneSettings, base: ResidentBaseModel, reserved: _Reserved
    ) -> RayHosting:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        layout = self.resolved_layout()
        group = build_placement(
            layout,
            timeout_s=self.placement_timeout_s,
            name=f"joynexus-{id(reserved):x}",
            strategy=self.strategy,
            role_resources=self.role_resources,
        )
        reserved.group = group
        source = BaseModelSource(settings.base_model or spec_of(base), settings.run_dir / "models")
        cfg = settings.config

        driver_node = ray.get_runtime_context().get_node_id()
        queue_handle = (
            ray.remote(TrainingQueue)
            .options(
                num_cpus=0,
                max_concurrency=64,
                scheduling_strategy=NodeAffinitySchedulingStrategy(driver_node, soft=False),
            )
            .remote(RayObjectStorePartitionStorage(), memory_cap_bytes=cfg.queue_memory_cap_bytes)
        )
        reserved.actors.append(queue_handle)
        queue = ActorProxy(queue_handle, TrainingQueue)
        env_handle = (
            ray.remote(actor_class(EnvironmentService, loads_base=False))
            .options(max_concurrency=64, **group.actor_options("environment"))
            .remote(cfg.env, clock=SystemClock())
        )
        reserved.actors.append(env_handle)
        env = ActorProxy(env_handle, EnvironmentService)
        ranks = self._training_ranks(group, source, queue, settings)
        reserved.actors.extend(rank.actor for rank in ranks)
        training: TrainingModelServiceAPI = ranks[0] if len(ranks) == 1 else DataParallelRole(ranks)

        async def make_engine(slot: int) -> EngineHandle:
            handle: Any = (
                ray.remote(actor_class(InferenceModelService))
                .options(max_concurrency=256, **group.actor_options("inference"))
                .remote(
                    source,
                    env,
                    queue,
                    max_batch_size=cfg.max_batch_size,
                    max_wait_s=cfg.max_wait_s,
                    tenant_batch_rows=cfg.tenant_batch_rows,
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
                if not await await_ref(handle.__ray_call__.remote(engine_running)):
                    raise ServiceUnavailableError("inference engine stopped unexpectedly")

            return EngineHandle(engine=engine, release=release, probe=probe)

        pool = EnginePool(
            make_engine,
            clock=SystemClock(),
            max_engines=layout.engines,
            is_engine_failure=is_engine_failure,
        )
        return RayHosting(
            reserved,
            queue=queue,
            env=env,
            training=training,
            training_ranks=ranks,
            pool=pool,
            engines=self.engines,
            autoscale=self.autoscale,
            usage=settings.usage,
        )

    def _training_ranks(
        self,
        group: ReservedGroup,
        source: BaseModelSource,
        queue: ActorProxy[TrainingQueue],
        settings: PlaneSettings,
    ) -> list[ActorProxy[TrainingModelService]]:
        """The training role's actors in the actor bundle: one Training Model Service,
        or ``training_ranks`` data-parallel ranks sharing the bundle's GPUs (one
        process group, rendezvous on rank 0's node)."""
        import ray

        k = self.training_ranks
        options = group.actor_options("actor")
        kwargs: dict[str, Any] = {
            "output_dir": settings.run_dir / "outputs",
            "clock": SystemClock(),
            "tenant_memory_budget": settings.config.tenant_memory_budget_bytes,
        }
        if k == 1:
            # Ray re-creates it in its bundle when its node is lost (the bundle is
            # re-placed on a node that fits); the probe then sees a new incarnation
            # and the Master rebuilds the tenant slots from their checkpoints. (k ranks
            # are not re-created: their process group met on the lost node.)
            handle = (
                ray.remote(actor_class(TrainingModelService))
                .options(max_concurrency=64, max_restarts=-1, **options)
                .remote(source, queue, **kwargs)
            )
            return [ActorProxy(handle, TrainingModelService)]
        if "num_gpus" in options:
            options["num_gpus"] = options["num_gpus"] / k
        host, port = ray.get(ray.remote(rendezvous).options(**{**options, "num_gpus": 0}).remote())
        ranks: list[ActorProxy[TrainingModelService]] = []
        for rank in range(k):
            group_of_rank = RankGroup(rank, k, f"tcp://{host}:{port}")
            handle = (
                ray.remote(actor_class(DataParallelTrainingService))
                .options(max_concurrency=64, **options)
                .remote(source, queue, ranks=group_of_rank, **kwargs)
            )
            ranks.append(ActorProxy(handle, TrainingModelService))
        return ranks
