"""The Environment Service (paper §4.1.2, Figure 4): tenant-owned simulator sessions.

Each session is one simulator (possibly vectorized, ``num_envs`` sub-envs) running in
its own worker process (:mod:`joynexus.services.env_worker`). The service enforces
ownership (a session belongs to the tenant that created it), per-tenant session
limits, step timeouts and idle reaping, and it hands back observations in the
tenant's :class:`~joynexus.models.schema.DataSchema`.

A simulator that crashes or hangs fails only its own session: calls on it raise
:class:`~joynexus.errors.SimulatorCrashedError` until the tenant closes it, and every
other session keeps running. Episodes auto-reset inside ``step`` (see
:mod:`joynexus.envs.base`); ``reset`` starts a new rollout explicitly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from joynexus.envs.base import (
    EnvObservation,
    EnvSpec,
    EnvStep,
    check_actions,
    check_group_size,
)
from joynexus.envs.registry import get_registration
from joynexus.errors import (
    CapacityError,
    EnvironmentServiceError,
    InvalidRequestError,
    SimulatorCrashedError,
    unknown_id,
)
from joynexus.metrics.events import MetricsService
from joynexus.metrics.hooks import Instruments
from joynexus.metrics.usage import UsageMeter
from joynexus.models.schema import DataSchema
from joynexus.services.env_worker import SimulatorWorker
from joynexus.utils.clock import Clock, SystemClock
from joynexus.utils.ids import random_id

__all__ = ["EnvironmentService", "EnvironmentServiceConfig", "SessionInfo"]


class EnvironmentServiceConfig(BaseModel):
    """Limits of the Environment Service.

    Args:
        max_sessions_per_tenant: Open sessions one tenant may hold at once.
        idle_timeout_s: A session untouched this long is closed by :meth:`reap_idle`.
        step_timeout_s: A reset/step that takes longer kills the session's worker.
        start_timeout_s: Time allowed to start a worker and build its simulator.
        worker_cores: Pin every simulator worker process to these cores at its start
            (None: not pinned); the model services get the others (``--device-cores``,
            :mod:`joynexus.utils.affinity`).
    """

    model_config = ConfigDict(extra="forbid")

    max_sessions_per_tenant: int = 8
    idle_timeout_s: float = 600.0
    step_timeout_s: float = 60.0
    start_timeout_s: float = 180.0
    worker_cores: list[int] | None = None


@dataclass(frozen=True)
class SessionInfo:
    """What :meth:`EnvironmentService.create_session` returns."""

    session_id: str
    tenant_id: str
    schema: DataSchema
    num_envs: int
    kind: str
    task: str | None = None


@dataclass
class _Session:
    session_id: str
    tenant_id: str
    spec: EnvSpec
    schema: DataSchema
    worker: SimulatorWorker
    last_used: float
    rollout_id: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def info(self) -> SessionInfo:
        return SessionInfo(
            session_id=self.session_id,
            tenant_id=self.tenant_id,
            schema=self.schema,
            num_envs=self.spec.num_envs,
            kind=self.spec.kind,
            task=self.spec.task,
        )


def _check_observation(obs: Any, schema: DataSchema, num_envs: int) -> EnvObservation:
    """A simulator's output must match the schema it declared; a mismatch is its bug."""
    if not isinstance(obs, EnvObservation):
        raise EnvironmentServiceError(
            f"simulator returned {type(obs).__name__}, not an observation"
        )
    if set(obs.cameras) != set(schema.cameras):
        raise EnvironmentServiceError(
            f"simulator returned cameras {sorted(obs.cameras)}, schema has {schema.camera_names}"
        )
    for name, cam in schema.cameras.items():
        expected = (num_envs, *cam.shape)
        if obs.cameras[name].shape != expected or obs.cameras[name].dtype != np.uint8:
            raise EnvironmentServiceError(
                f"camera {name!r}: simulator returned {obs.cameras[name].dtype}"
                f"{list(obs.cameras[name].shape)}, schema expects uint8{list(expected)}"
            )
    if obs.state.shape != (num_envs, schema.state_dim):
        raise EnvironmentServiceError(
            f"state: simulator returned {list(obs.state.shape)}, "
            f"schema expects {[num_envs, schema.state_dim]}"
        )
    return obs


class EnvironmentService:
    """Session-based reset / step / close over isolated simulator workers.

    Args:
        config: Limits and timeouts.
        clock: Time source for idle reaping (tests pass a ``FakeClock``).
        metrics: Metrics Service for per-tenant step latency (None: none emitted).
        usage: Usage meter: each successful reset / step's seconds and sub-env steps go
            to the session's tenant.
        on_crash: Told ``(session_id, tenant_id, reason)`` the moment a reset / step
            finds the session's simulator dead, before the error reaches the caller (a
            Health Manager takes the session out of use at once, so the caller's retry
            does not hit the dead session again).
    """

    def __init__(
        self,
        config: EnvironmentServiceConfig | None = None,
        *,
        clock: Clock | None = None,
        metrics: MetricsService | None = None,
        usage: UsageMeter | None = None,
        on_crash: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.config = config or EnvironmentServiceConfig()
        self.on_crash = on_crash
        self._instruments = Instruments(metrics, usage)
        self.clock: Clock = clock or SystemClock()
        self._sessions: dict[str, _Session] = {}
        self._reserved: dict[str, int] = {}

    # -- sessions ---------------------------------------------------------------------

    def _tenant_count(self, tenant_id: str) -> int:
        open_ = sum(1 for s in self._sessions.values() if s.tenant_id == tenant_id)
        return open_ + self._reserved.get(tenant_id, 0)

    async def create_session(self, tenant_id: str, spec: EnvSpec) -> SessionInfo:
        """Start a simulator for ``tenant_id`` in a new worker process.

        Raises:
            SpecError: Unknown env kind or a spec the kind rejects.
            CapacityError: The tenant already holds ``max_sessions_per_tenant`` sessions.
            SimulatorCrashedError: The worker died or timed out while starting.
        """
        registration = get_registration(spec.kind)
        limit = self.config.max_sessions_per_tenant
        if self._tenant_count(tenant_id) >= limit:
            raise CapacityError(
                f"tenant {tenant_id!r} already holds {limit} environment sessions "
                "(max_sessions_per_tenant); close one first",
                tenant_id=tenant_id,
                limit=limit,
            )
        # Reserve the slot before the (slow) start so concurrent creates respect the limit.
        self._reserved[tenant_id] = self._reserved.get(tenant_id, 0) + 1
        try:
            worker, schema_json = await SimulatorWorker.start(
                registration.factory,
                spec,
                timeout_s=self.config.start_timeout_s,
                cores=self.config.worker_cores,
            )
        finally:
            self._reserved[tenant_id] -= 1
        session = _Session(
            # Random: nobody can guess another tenant's session id or count sessions.
            session_id=random_id("env"),
            tenant_id=tenant_id,
            spec=spec,
            schema=DataSchema.model_validate_json(schema_json),
            worker=worker,
            last_used=self.clock.now(),
        )
        self._sessions[session.session_id] = session
        return session.info()

    def _owned(self, session_id: str, tenant_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None or session.tenant_id != tenant_id:
            # Another tenant's session answers exactly as an unknown one: no oracle.
            raise unknown_id("session", session_id)
        return session

    async def list_sessions(self, tenant_id: str) -> list[SessionInfo]:
        """The tenant's open sessions (crashed ones included until closed)."""
        return [s.info() for s in self._sessions.values() if s.tenant_id == tenant_id]

    # -- Figure 4 primitives ----------------------------------------------------------------

    async def reset(
        self,
        session_id: str,
        rollout_id: str,
        seed: int | None = None,
        *,
        tenant_id: str,
        group_size: int = 1,
    ) -> EnvObservation:
        """Start rollout ``rollout_id``: new episodes in every sub-env of the session.

        Sub-env ``i`` is seeded with ``seed + i // group_size``: with ``group_size`` > 1
        the sub-envs form groups that start from one initial state (GRPO's rollouts per
        initial state; auto-resets stay aligned by episode ordinal, see
        :mod:`joynexus.envs.base`).

        Raises:
            NotFoundError: Unknown session, or another tenant's (answered alike).
            InvalidRequestError: ``group_size`` does not divide the session's
                ``num_envs``, or a grouped reset without a seed.
            SpecError: A grouped reset of an env kind that cannot group its sub-envs.
            SimulatorCrashedError: The simulator died or exceeded ``step_timeout_s``.
        """
        session = self._owned(session_id, tenant_id)
        check_group_size(session.spec.num_envs, group_size)
        if group_size > 1 and seed is None:
            raise InvalidRequestError(
                "a grouped reset needs a seed (the seed is what the sub-envs of a group share)",
                field="seed",
            )
        async with session.lock:
            session.last_used = self.clock.now()
            start = time.perf_counter()
            obs = await self._call(session, "reset", (seed, group_size))
            self._instruments.env_call(session.tenant_id, 0, time.perf_counter() - start)
            session.rollout_id = rollout_id
            session.last_used = self.clock.now()
        return _check_observation(obs, session.schema, session.spec.num_envs)

    async def step(self, session_id: str, actions: Any, *, tenant_id: str) -> EnvStep:
        """Apply float32 ``[num_envs, action_dim]`` actions; finished episodes auto-reset.

        Raises:
            NotFoundError: Unknown session, or another tenant's (answered alike).
            SchemaMismatchError: ``actions`` does not have the session's shape.
            SimulatorCrashedError: The simulator died or exceeded ``step_timeout_s``.
        """
        session = self._owned(session_id, tenant_id)
        acts = check_actions(
            actions, num_envs=session.spec.num_envs, action_dim=session.schema.action_dim
        )
        async with session.lock:
            session.last_used = self.clock.now()
            start = time.perf_counter()
            result = await self._call(session, "step", acts)
            self._instruments.env_call(
                session.tenant_id,
                session.spec.num_envs,
                time.perf_counter() - start,
                wait_s=session.worker.last_wait_s,
            )
            session.last_used = self.clock.now()
        if not isinstance(result, EnvStep):
            raise EnvironmentServiceError(f"simulator returned {type(result).__name__}, not a step")
        _check_observation(result.observation, session.schema, session.spec.num_envs)
        result.info["rollout_id"] = session.rollout_id
        return result

    async def _call(self, session: _Session, op: str, arg: Any) -> Any:
        try:
            return await session.worker.call(op, arg, timeout_s=self.config.step_timeout_s)
        except SimulatorCrashedError as error:
            if self.on_crash is not None:
                self.on_crash(session.session_id, session.tenant_id, error.message)
            raise

    async def close(self, session_id: str, *, tenant_id: str) -> None:
        """Close the session and stop its worker (also after a crash).

        Raises:
            NotFoundError: Unknown session, or another tenant's (answered alike).
        """
        session = self._owned(session_id, tenant_id)
        del self._sessions[session_id]
        async with session.lock:
            await session.worker.close()

    async def reap_idle(self) -> list[str]:
        """Close sessions idle longer than ``idle_timeout_s``; returns their ids."""
        deadline = self.clock.now() - self.config.idle_timeout_s
        idle = [
            s for s in self._sessions.values() if s.last_used <= deadline and not s.lock.locked()
        ]
        for session in idle:
            self._sessions.pop(session.session_id, None)
            await session.worker.close()
        return [s.session_id for s in idle]

    async def run_reaper(self, interval_s: float = 30.0) -> None:
        """Reap idle sessions every ``interval_s`` (run it as a task; cancel to stop)."""
        while True:
            await self.clock.sleep(interval_s)
            await self.reap_idle()

    async def aclose(self) -> None:
        """Close every session (service shutdown)."""
        sessions = list(self._sessions.values())
        self._sessions.clear()
        await asyncio.gather(*(s.worker.close() for s in sessions))

    def is_crashed(self, session_id: str) -> bool:
        """Whether the session's simulator has died (its calls raise SimulatorCrashedError)."""
        session = self._sessions.get(session_id)
        if session is None:
            return False
        # A killed worker is crashed before any call notices it.
        return session.worker.dead_reason is not None or not session.worker.process.is_alive()
