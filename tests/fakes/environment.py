"""The fake Environment Service: numpy sub-envs instead of simulator workers."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from joynexus.envs.base import (
    EnvObservation,
    EnvSpec,
    EnvStep,
    check_actions,
    check_group_size,
)
from joynexus.envs.registry import env_schema
from joynexus.errors import (
    CapacityError,
    InvalidRequestError,
    SimulatorCrashedError,
    unknown_id,
)
from joynexus.services.environment import SessionInfo
from tests.fakes.base import _thread_hop


@dataclass
class _Session:
    info: SessionInfo
    episode_steps: int
    steps: np.ndarray
    rollout_id: str | None = None
    crashed: bool = False


class FakeEnvironmentService:
    """The Environment Service's contract (``tests/contracts``) with numpy sub-envs.

    Episodes last ``spec.max_episode_steps`` (default 4) steps; every step rewards 0.1;
    an episode of an even sub-env succeeds. Finished sub-envs auto-reset, like the real
    adapters. Observations are zeros in the env kind's schema. :meth:`crash` kills a
    session's "simulator" (fault tests): its calls raise ``SimulatorCrashedError``.

    Attributes:
        closed: Session ids closed so far, in order.
    """

    def __init__(self, *, max_sessions_per_tenant: int = 4) -> None:
        self.max_sessions_per_tenant = max_sessions_per_tenant
        self._sessions: dict[str, _Session] = {}
        self._ids = itertools.count(1)
        self.closed: list[str] = []

    def _owned(self, session_id: str, tenant_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None or session.info.tenant_id != tenant_id:
            # As the real service: another tenant's session answers as an unknown one.
            raise unknown_id("session", session_id)
        return session

    def _alive(self, session_id: str, tenant_id: str) -> _Session:
        session = self._owned(session_id, tenant_id)
        if session.crashed:
            raise SimulatorCrashedError(f"session {session_id!r}: the simulator died")
        return session

    def open_sessions(self, tenant_id: str) -> list[str]:
        return [sid for sid, s in self._sessions.items() if s.info.tenant_id == tenant_id]

    async def create_session(self, tenant_id: str, spec: EnvSpec) -> SessionInfo:
        schema = env_schema(spec)  # SpecError for an unknown kind, like the real one
        limit = self.max_sessions_per_tenant
        if len(self.open_sessions(tenant_id)) >= limit:
            raise CapacityError(
                f"tenant {tenant_id!r} already holds {limit} environment sessions "
                "(max_sessions_per_tenant); close one first",
                tenant_id=tenant_id,
                limit=limit,
            )
        await _thread_hop()
        sid = f"env-{next(self._ids)}"
        info = SessionInfo(sid, tenant_id, schema, spec.num_envs, spec.kind, spec.task)
        steps = np.zeros(spec.num_envs, np.int64)
        self._sessions[sid] = _Session(info, spec.max_episode_steps or 4, steps)
        return info

    async def list_sessions(self, tenant_id: str) -> list[SessionInfo]:
        return [s.info for s in self._sessions.values() if s.info.tenant_id == tenant_id]

    def _observation(self, session: _Session) -> EnvObservation:
        schema, n = session.info.schema, session.info.num_envs
        return EnvObservation(
            cameras={c: np.zeros((n, *cam.shape), np.uint8) for c, cam in schema.cameras.items()},
            state=np.zeros((n, schema.state_dim), np.float32),
            instruction=schema.instruction,
        )

    async def reset(
        self,
        session_id: str,
        rollout_id: str,
        seed: int | None = None,
        *,
        tenant_id: str,
        group_size: int = 1,
    ) -> EnvObservation:
        session = self._alive(session_id, tenant_id)
        check_group_size(session.info.num_envs, group_size)
        if group_size > 1 and seed is None:
            raise InvalidRequestError("a grouped reset needs a seed", field="seed")
        session.steps[:] = 0
        session.rollout_id = rollout_id
        return self._observation(session)

    async def step(self, session_id: str, actions: Any, *, tenant_id: str) -> EnvStep:
        session = self._alive(session_id, tenant_id)
        n = session.info.num_envs
        check_actions(actions, num_envs=n, action_dim=session.info.schema.action_dim)
        session.steps += 1
        ended = session.steps >= session.episode_steps
        session.steps[ended] = 0  # auto-reset
        return EnvStep(
            observation=self._observation(session),
            reward=np.full(n, 0.1, np.float32),
            terminated=ended.copy(),
            truncated=np.zeros(n, bool),
            success=ended & (np.arange(n) % 2 == 0),
            info={"rollout_id": session.rollout_id},
        )

    async def close(self, session_id: str, *, tenant_id: str) -> None:
        self._owned(session_id, tenant_id)
        del self._sessions[session_id]
        self.closed.append(session_id)

    async def aclose(self) -> None:
        self.closed.extend(self._sessions)
        self._sessions.clear()

    def is_crashed(self, session_id: str) -> bool:
        session = self._sessions.get(session_id)
        return session is not None and session.crashed  # only when a test crashed it

    def crash(self, session_id: str) -> None:
        """Kill the session's simulator (fault tests)."""
        self._sessions[session_id].crashed = True
