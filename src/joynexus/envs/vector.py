"""A vectorized adapter over N single simulators, with same-step auto-reset.

Most simulators are single-instance gymnasium envs. Rather than each adapter
re-implementing batching, an adapter implements :class:`SingleEnv` for one instance
and :class:`VectorEnvAdapter` steps ``N`` of them in turn, stacks the results into the
tenant's schema, truncates at ``max_episode_steps`` and applies the auto-reset rule
documented in :mod:`joynexus.envs.base`. Stepping in turn (not in sub-processes) is
deliberate: the Environment Service already runs each session in its own worker process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from joynexus.envs.base import (
    EnvAdapter,
    EnvObservation,
    EnvStep,
    check_actions,
    check_group_size,
    stack_observations,
)
from joynexus.errors import SpecError
from joynexus.models.schema import DataSchema

__all__ = ["SingleEnv", "SingleObservation", "SingleStep", "VectorEnvAdapter", "gym_envs"]


@dataclass
class SingleObservation:
    """One sub-env's observation: camera frames ``[H, W, C]`` uint8 and state ``[D]``."""

    cameras: dict[str, np.ndarray]
    state: np.ndarray


@dataclass
class SingleStep:
    """One sub-env's transition."""

    observation: SingleObservation
    reward: float
    terminated: bool
    truncated: bool
    success: bool
    info: dict[str, Any] = field(default_factory=dict)


class SingleEnv(Protocol):
    """One simulator instance whose output already matches the schema's shapes."""

    def reset(self, seed: int | None) -> SingleObservation: ...

    def step(self, action: np.ndarray) -> SingleStep: ...

    def close(self) -> None: ...


class VectorEnvAdapter(EnvAdapter):
    """``N`` :class:`SingleEnv` instances stepped together as one adapter.

    Args:
        envs: The sub-envs (at least one).
        schema: The schema they produce.
        max_episode_steps: Truncate an episode after this many steps (``None``: never;
            the sub-env may still truncate on its own).
    """

    def __init__(
        self,
        envs: list[SingleEnv],
        schema: DataSchema,
        *,
        max_episode_steps: int | None = None,
    ) -> None:
        if not envs:
            raise ValueError("a vectorized env needs at least one sub-env")
        self.envs = envs
        self.schema = schema
        self.num_envs = len(envs)
        self.max_episode_steps = max_episode_steps
        self._elapsed = np.zeros(self.num_envs, dtype=np.int64)
        self._last: list[SingleObservation] | None = None
        self._next_seed: list[int | None] = [None] * self.num_envs
        self._seed_stride = self.num_envs
        self._closed = False

    def _observation(self, obs: list[SingleObservation]) -> EnvObservation:
        return stack_observations(
            [o.cameras for o in obs], [o.state for o in obs], self.schema.instruction
        )

    def reset(self, seed: int | None = None, *, group_size: int = 1) -> EnvObservation:
        groups = check_group_size(self.num_envs, group_size)
        obs = []
        for i, env in enumerate(self.envs):
            sub_seed = None if seed is None else seed + i // group_size
            obs.append(env.reset(sub_seed))
            # Later auto-resets continue a deterministic seed sequence per sub-env, the
            # same for every sub-env of a group (aligned by episode ordinal).
            self._next_seed[i] = None if sub_seed is None else sub_seed + groups
        self._seed_stride = groups
        self._elapsed[:] = 0
        self._last = obs
        return self._observation(obs)

    def step(self, actions: np.ndarray) -> EnvStep:
        acts = check_actions(actions, num_envs=self.num_envs, action_dim=self.schema.action_dim)
        if self._last is None:
            self.reset()
        n = self.num_envs
        reward = np.zeros(n, np.float32)
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        success = np.zeros(n, bool)
        final: list[SingleObservation] = []
        current: list[SingleObservation] = []
        infos: list[dict[str, Any]] = []
        for i, env in enumerate(self.envs):
            st = env.step(acts[i])
            self._elapsed[i] += 1
            reward[i] = st.reward
            terminated[i] = st.terminated
            limit_hit = self.max_episode_steps is not None and (
                self._elapsed[i] >= self.max_episode_steps
            )
            truncated[i] = bool(st.truncated or (limit_hit and not st.terminated))
            success[i] = st.success
            infos.append(st.info)
            final.append(st.observation)
            if terminated[i] or truncated[i]:
                seed = self._next_seed[i]
                if seed is not None:
                    self._next_seed[i] = seed + self._seed_stride
                current.append(env.reset(seed))
                self._elapsed[i] = 0
            else:
                current.append(st.observation)
        self._last = current
        info: dict[str, Any] = {"sub_infos": infos}
        if np.any(terminated | truncated):
            info["final_observation"] = self._observation(final)
        return EnvStep(
            observation=self._observation(current),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=success,
            info=info,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for env in self.envs:
            env.close()


def gym_envs(env: EnvAdapter) -> list[Any]:
    """The unwrapped gymnasium envs behind a local adapter (for privileged state)."""
    subs = getattr(env, "envs", None)
    if not subs:
        raise SpecError(
            "the scripted expert needs a local simulator adapter (it reads the simulator's "
            "internal state); this env does not expose its sub-envs"
        )
    out = []
    for sub in subs:
        gym_env = getattr(sub, "env", None)
        if gym_env is None:
            raise SpecError("the scripted expert cannot reach this adapter's simulator")
        out.append(getattr(gym_env, "unwrapped", gym_env))
    return out
