"""The embedded runtime plus a rollout-engine pool and a Health Manager.

:class:`ManagedRuntime` runs workloads exactly like
:class:`~joynexus.runtime.embedded.EmbeddedRuntime` (same orchestration, same workflow
loops), but the loops reach inference through an :class:`~joynexus.runtime.scaling.
EnginePool` and every resident role is watched by a :class:`~joynexus.runtime.health.
HealthManager`:

* ``inference/<id>``: restarted in place and re-synced to every tenant's latest
  published weights (the pool records them);
* ``environment``: a crashed simulator session is closed and recreated with the same
  spec; the rollout that was using it failed, and its producer reserves a new job. The
  crash is reported the moment a call finds the worker dead, and the tenant's session is
  taken out of use until it is recreated, so the producer backs off instead of reserving
  jobs against the dead session (one failed job per crash);
* ``training`` (and, in the Ray runtime, the Training Queue): shared state (optimizer
  state, partitions) cannot be rebuilt in place, so their failure escalates to a global
  restart at once: the run stops with :class:`ServiceUnavailableError`, and running it
  again on the same run directory resumes from the durable scheduler and checkpoints.

Subclasses change where the services live by overriding the plane's ``make_*``
factories and ``_make_engine`` (the Ray runtime returns actor proxies).
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any, cast

from joynexus.errors import ServiceUnavailableError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.queues.training import TrainingQueue
from joynexus.runtime.embedded import EmbeddedRuntime, RuntimeConfig
from joynexus.runtime.health import HealthManager
from joynexus.runtime.plane import PlaneSettings, new_inference
from joynexus.runtime.scaling import AutoscalePolicy, Autoscaler, EngineHandle, EnginePool
from joynexus.runtime.sessions import SessionRecovery
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.utils.clock import Clock
from joynexus.workflows.compile import CompiledRun

__all__ = ["ManagedRuntime"]


class ManagedRuntime(EmbeddedRuntime):
    """Embedded runtime with elastic rollout engines and partial restart.

    Args:
        run_dir / config / clock: As for :class:`EmbeddedRuntime`.
        engines: Rollout engines at start.
        max_engines: Upper bound of the pool (None: unbounded).
        health_check_s: Period of the health monitor.
        recovery_budget: Restarts per role before a global restart.
        autoscale: Optional pressure-driven pool sizing (off by default).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        config: RuntimeConfig | None = None,
        clock: Clock | None = None,
        engines: int = 1,
        max_engines: int | None = None,
        health_check_s: float = 0.5,
        recovery_budget: int = 3,
        autoscale: AutoscalePolicy | None = None,
    ) -> None:
        super().__init__(run_dir, config=config, clock=clock)
        self.initial_engines = engines
        self.health = HealthManager(
            self.clock,
            default_budget=recovery_budget,
            heartbeat_timeout_s=None,
            check_interval_s=health_check_s,
            on_global_restart=self._on_global_restart,
        )
        self.pool = EnginePool(
            self._make_engine,
            clock=self.clock,
            max_engines=max_engines,
            is_engine_failure=self._is_engine_failure,
            on_engine_failure=self._on_engine_failure,
        )
        self.autoscaler = Autoscaler(self.pool, autoscale or AutoscalePolicy(), self.clock)
        self._settings: PlaneSettings | None = None
        self._background: list[asyncio.Task[None]] = []
        self._escalation: asyncio.Event | None = None  # created inside the run's loop
        self.sessions: SessionRecovery | None = None  # the environment role, once started

    # ------------------------------------------------------------------ factories

    def make_inference(
        self,
        s: PlaneSettings,
        base: ResidentBaseModel,
        env: EnvironmentService,
        queue: TrainingQueue,
    ) -> InferenceModelService:
        # The loops reach the engines through the pool (same interface), started with
        # the other services.
        self._settings = s
        return cast(InferenceModelService, self.pool)

    async def _make_engine(self, slot: int) -> EngineHandle:
        assert self.plane is not None and self._settings is not None
        engine = new_inference(self._settings, self.plane.base, self.plane.env, self.plane.queue)
        await engine.start()

        async def probe() -> None:
            if not engine.inference_queue.running:
                raise ServiceUnavailableError("inference engine stopped unexpectedly")

        return EngineHandle(engine=engine, probe=probe)

    def _is_engine_failure(self, error: BaseException) -> bool:
        return isinstance(error, ServiceUnavailableError)

    async def _probe_training(self) -> None:
        """Liveness of the training role (in process it cannot die alone)."""

    async def _release_extra(self) -> None:
        """Free what a subclass reserved beyond the services (placement groups)."""

    # ------------------------------------------------------------------ services

    async def _start_services(self) -> None:
        self._escalation = asyncio.Event()
        await self.pool.start(self.initial_engines)
        self._sync_health_roles()
        assert self.env is not None
        self.sessions = SessionRecovery(self.env, lambda: self.tenants.values(), self.health)
        self.sessions.register()
        self.health.register(
            "training", self._fail_training, probe=self._probe_training, shared=True
        )
        self._background = [asyncio.create_task(self.health.run(), name="health")]
        if self.autoscaler.policy.enabled:
            self._background.append(asyncio.create_task(self.autoscaler.run(), name="autoscale"))

    async def _stop_services(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background = []
        try:
            await self.pool.stop()
            if self.env is not None:
                await self.env.aclose()
        finally:
            await self._release_extra()

    async def _fail_training(self) -> None:
        raise ServiceUnavailableError("the training role cannot be restarted in place")

    # ------------------------------------------------------------------ health wiring

    def _sync_health_roles(self) -> None:
        live = {f"inference/{i}" for i in self.pool.engine_ids()}
        for role in self.health.roles():
            if role.startswith("inference/") and role not in live:
                self.health.unregister(role)
        for engine_id in self.pool.engine_ids():
            role = f"inference/{engine_id}"
            if role not in self.health.roles():
                self.health.register(
                    role,
                    functools.partial(self.pool.restart_engine, engine_id),
                    probe=functools.partial(self._probe_engine, engine_id),
                )

    async def _probe_engine(self, engine_id: int) -> None:
        handle = self.pool.handle(engine_id)
        if handle.probe is not None:
            await handle.probe()

    async def _on_engine_failure(self, engine_id: int, error: BaseException) -> None:
        role = f"inference/{engine_id}"
        if role in self.health.roles():
            await self.health.report_error(role, error)

    async def _on_global_restart(self, reason: str) -> None:
        if self._escalation is not None:
            self._escalation.set()

    async def _wait(self, compiled: CompiledRun, loops: list[Any], on_progress: Any) -> None:
        assert self._escalation is not None
        waiter = asyncio.ensure_future(super()._wait(compiled, loops, on_progress))
        escalated = asyncio.ensure_future(self._escalation.wait())
        try:
            await asyncio.wait({waiter, escalated}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            escalated.cancel()
        if not waiter.done():
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            raise ServiceUnavailableError(
                f"global restart required ({self.health.escalated}); run again on the same "
                "run directory to resume from the scheduler state and checkpoints"
            )
        waiter.result()

    # ------------------------------------------------------------------ operations

    async def scale_rollout(self, n: int) -> int:
        """Scale the rollout-engine pool to ``n`` engines (serialized; rolled back on
        failure); returns the new size."""
        try:
            return await self.pool.scale_to(n)
        finally:
            self._sync_health_roles()
