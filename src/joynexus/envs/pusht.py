"""gym-pusht adapter: a top-down camera plus the agent's 2-D position; 2-D actions.

Actions are the absolute target position of the pusher in the 512×512 workspace
(gym-pusht's own action space). The episode terminates on success (T-block coverage
above the task's threshold) and truncates after ``max_episode_steps`` (300 by default).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from joynexus.envs.base import EnvAdapter, EnvSpec
from joynexus.envs.registry import register_env
from joynexus.envs.vector import SingleEnv, SingleObservation, SingleStep, VectorEnvAdapter
from joynexus.errors import SpecError
from joynexus.models.schema import PUSHT, CameraSpec, DataSchema

__all__ = ["DEFAULT_IMAGE_SIZE", "make_pusht", "pusht_schema"]

DEFAULT_IMAGE_SIZE = 96
_GYM_ID = "gym_pusht/PushT-v0"


def _check_spec(spec: EnvSpec) -> None:
    if spec.task not in (None, "pusht", "PushT-v0"):
        raise SpecError(f"pusht has a single task; got task={spec.task!r} (use null)")
    if spec.options:
        raise SpecError(f"pusht takes no options, got {sorted(spec.options)}")


def pusht_schema(spec: EnvSpec) -> DataSchema:
    """The PushT schema with the camera at ``spec.image_size`` (default 96)."""
    _check_spec(spec)
    size = spec.image_size or DEFAULT_IMAGE_SIZE
    return PUSHT.model_copy(update={"cameras": {"top": CameraSpec(height=size, width=size)}})


class _PushTSingle:
    def __init__(self, spec: EnvSpec, size: int) -> None:
        # pygame must never try to open a window on a headless worker.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        import gym_pusht  # noqa: F401  (registers the gym id)
        import gymnasium as gym

        kwargs: dict[str, Any] = {
            "obs_type": "pixels_agent_pos",
            "render_mode": "rgb_array",
            "observation_width": size,
            "observation_height": size,
        }
        if spec.max_episode_steps is not None:
            kwargs["max_episode_steps"] = spec.max_episode_steps
        self.env = gym.make(_GYM_ID, **kwargs)

    @staticmethod
    def _obs(obs: dict[str, Any]) -> SingleObservation:
        return SingleObservation(
            cameras={"top": np.asarray(obs["pixels"], dtype=np.uint8)},
            state=np.asarray(obs["agent_pos"], dtype=np.float32),
        )

    def reset(self, seed: int | None) -> SingleObservation:
        obs, _ = self.env.reset(seed=seed)
        return self._obs(obs)

    def step(self, action: np.ndarray) -> SingleStep:
        obs, reward, terminated, truncated, info = self.env.step(action)
        success = bool(info.get("is_success", False))
        return SingleStep(
            observation=self._obs(obs),
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            success=success,
            info={"coverage": float(info.get("coverage", 0.0))},
        )

    def close(self) -> None:
        self.env.close()


def make_pusht(spec: EnvSpec) -> EnvAdapter:
    """Build a (possibly vectorized) PushT adapter from ``spec``."""
    schema = pusht_schema(spec)
    size = schema.cameras["top"].height
    envs: list[SingleEnv] = [_PushTSingle(spec, size) for _ in range(spec.num_envs)]
    return VectorEnvAdapter(envs, schema)


register_env(
    "pusht",
    "joynexus.envs.pusht:make_pusht",
    schema="joynexus.envs.pusht:pusht_schema",
    description="gym-pusht: push a T block onto its target (top camera + 2-D agent position)",
    requires=["gym_pusht", "pymunk", "pygame"],
)
