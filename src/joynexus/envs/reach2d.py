"""reach2d: a small, real 2-D point-reaching simulator written with numpy.

An agent (a point) moves in the square ``[-1, 1]²`` towards a goal drawn uniformly at
reset. Actions are 2-D velocities in ``[-1, 1]`` (clipped), scaled by
``options.max_speed`` per step. The reward of a step is the negative distance to the
goal after the move, plus ``options.success_bonus`` on the step the agent comes within
``options.goal_radius`` of the goal; that step succeeds and terminates the episode.
Episodes truncate after ``max_episode_steps`` (30 by default).

Observations: one top-down camera ``"top"`` rendered with numpy at ``image_size``
(default 64; goal a green disc, agent a red disc on a grey floor), and the state
``[agent_x, agent_y, goal_x, goal_y]`` — or, with ``observation.state: proprio``, the
agent's own position ``[agent_x, agent_y]`` only, so that the goal is seen only in the
image (the easiest task for learning from pixels; the scripted expert then reads the
goal from the simulator, :func:`goals`).

This is the "easy task" of the project's learning proofs: because the goal is part of
the state, a small action head reading the state learns the optimal policy ("move along
goal − agent") with PPO within minutes on a CPU, and supervised fine-tuning on the
scripted expert (:class:`Reach2DScriptedPolicy`) converges in a few hundred steps. No
simulator package is needed, so it is available everywhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from joynexus.envs.base import EnvAdapter, EnvObservation, EnvSpec
from joynexus.envs.registry import register_env
from joynexus.envs.vector import SingleEnv, SingleObservation, SingleStep, VectorEnvAdapter
from joynexus.errors import SpecError
from joynexus.models.schema import CameraSpec, DataSchema

__all__ = [
    "DEFAULT_IMAGE_SIZE",
    "DEFAULT_MAX_EPISODE_STEPS",
    "Reach2DScriptedPolicy",
    "Reach2DSim",
    "goals",
    "make_reach2d",
    "reach2d_schema",
]

DEFAULT_IMAGE_SIZE = 64
DEFAULT_MAX_EPISODE_STEPS = 30
INSTRUCTION = "Move the red point to the green goal."
_OPTIONS: dict[str, float] = {"max_speed": 0.15, "goal_radius": 0.1, "success_bonus": 5.0}
#: The agent's own part of the state: its position.
_PROPRIO_DIM = 2
_FLOOR = np.array([200, 200, 200], dtype=np.uint8)
_GOAL = np.array([40, 170, 60], dtype=np.uint8)
_AGENT = np.array([210, 40, 40], dtype=np.uint8)


def _options(spec: EnvSpec) -> dict[str, float]:
    unknown = sorted(set(spec.options) - set(_OPTIONS))
    if unknown:
        raise SpecError(
            f"reach2d: unknown option(s) {unknown}; allowed options: {sorted(_OPTIONS)}",
            field="env.options",
        )
    out = dict(_OPTIONS)
    for key, value in spec.options.items():
        if not isinstance(value, int | float) or value <= 0:
            raise SpecError(
                f"reach2d: option {key!r} must be a positive number, got {value!r}",
                field=f"env.options.{key}",
            )
        out[key] = float(value)
    return out


def reach2d_schema(spec: EnvSpec) -> DataSchema:
    """The reach2d schema: camera ``top`` at ``spec.image_size``, state 4 (2 with
    ``observation.state: proprio``), action 2."""
    if spec.task not in (None, "reach2d"):
        raise SpecError(f"reach2d has a single task; got task={spec.task!r} (use null)")
    _options(spec)
    size = spec.image_size or DEFAULT_IMAGE_SIZE
    return DataSchema(
        name="reach2d",
        cameras={"top": CameraSpec(height=size, width=size)},
        state_dim=_PROPRIO_DIM if spec.observation.state == "proprio" else 4,
        action_dim=2,
        action_chunk=1,
        fps=10.0,
        instruction=INSTRUCTION,
    )


class Reach2DSim:
    """One reach2d simulator instance (implements :class:`SingleEnv`)."""

    def __init__(
        self, size: int, options: dict[str, float] | None = None, *, proprio: bool = False
    ) -> None:
        opts = {**_OPTIONS, **(options or {})}
        self.size = size
        self.proprio = proprio
        self.max_speed = opts["max_speed"]
        self.goal_radius = opts["goal_radius"]
        self.success_bonus = opts["success_bonus"]
        self.rng = np.random.default_rng()
        self.agent = np.zeros(2, dtype=np.float64)
        self.goal = np.zeros(2, dtype=np.float64)
        # Pixel-centre coordinates in [-1, 1], built once per instance.
        axis = (np.arange(size, dtype=np.float64) + 0.5) / size * 2.0 - 1.0
        self._xx, self._yy = np.meshgrid(axis, -axis)

    def distance(self) -> float:
        return float(np.linalg.norm(self.agent - self.goal))

    def _disc(self, centre: np.ndarray, radius: float) -> np.ndarray:
        mask: np.ndarray = (self._xx - centre[0]) ** 2 + (self._yy - centre[1]) ** 2 <= radius**2
        return mask

    def render(self) -> np.ndarray:
        """RGB uint8 ``[size, size, 3]``; +y points up in the image."""
        image = np.empty((self.size, self.size, 3), dtype=np.uint8)
        image[:] = _FLOOR
        # At least one pixel wide, so the discs survive tiny images.
        pixel = 2.0 / self.size
        image[self._disc(self.goal, max(self.goal_radius, pixel))] = _GOAL
        image[self._disc(self.agent, max(0.06, pixel))] = _AGENT
        return image

    def _obs(self) -> SingleObservation:
        parts = [self.agent] if self.proprio else [self.agent, self.goal]
        state = np.concatenate(parts).astype(np.float32)
        return SingleObservation(cameras={"top": self.render()}, state=state)

    def reset(self, seed: int | None) -> SingleObservation:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agent = self.rng.uniform(-0.9, 0.9, size=2)
        self.goal = self.rng.uniform(-0.9, 0.9, size=2)
        while np.linalg.norm(self.agent - self.goal) < 3 * self.goal_radius:
            self.goal = self.rng.uniform(-0.9, 0.9, size=2)
        return self._obs()

    def step(self, action: np.ndarray) -> SingleStep:
        velocity = np.clip(np.asarray(action, dtype=np.float64).reshape(2), -1.0, 1.0)
        self.agent = np.clip(self.agent + self.max_speed * velocity, -1.0, 1.0)
        dist = self.distance()
        success = dist <= self.goal_radius
        reward = -dist + (self.success_bonus if success else 0.0)
        return SingleStep(
            observation=self._obs(),
            reward=float(reward),
            terminated=bool(success),
            truncated=False,
            success=bool(success),
            info={"distance": dist},
        )

    def close(self) -> None:
        return None


class Reach2DScriptedPolicy:
    """The expert: full speed along ``goal − agent``, slowing down near the goal.

    It reads the observation's state, so demonstrations are learnable from it; when
    the tenant observes only the agent (``observation.state: proprio``) it reads the goal
    from the simulator (:func:`goals`), as a demonstrator who sees the scene would.
    """

    def __init__(self, max_speed: float = _OPTIONS["max_speed"]) -> None:
        self.max_speed = max_speed

    def reset(self) -> None:
        return None

    def act(self, env: Any, obs: EnvObservation) -> np.ndarray:
        goal = obs.state[:, 2:4] if obs.state.shape[1] >= 4 else goals(env)
        if goal is None:
            raise SpecError(
                "reach2d's scripted expert needs the goal: record with observation.state "
                "'default', or from a local reach2d env"
            )
        delta = goal - obs.state[:, 0:2]
        # Velocity that would land on the goal this step, capped at unit speed.
        velocity = delta / self.max_speed
        norm = np.linalg.norm(velocity, axis=1, keepdims=True)
        scale = np.where(norm > 1.0, 1.0 / np.maximum(norm, 1e-9), 1.0)
        out: np.ndarray = (velocity * scale).astype(np.float32)
        return out


def goals(env: Any) -> np.ndarray | None:
    """The sub-envs' goals ``[N, 2]``, or None when ``env`` is not a reach2d adapter of
    this process."""
    subs = getattr(env, "envs", None)
    if not subs or not all(isinstance(e, Reach2DSim) for e in subs):
        return None
    return np.stack([e.goal for e in subs]).astype(np.float32)


def make_reach2d(spec: EnvSpec) -> EnvAdapter:
    """Build a (possibly vectorized) reach2d adapter from ``spec``."""
    schema = reach2d_schema(spec)
    size = schema.cameras["top"].height
    opts = _options(spec)
    proprio = spec.observation.state == "proprio"
    envs: list[SingleEnv] = [Reach2DSim(size, opts, proprio=proprio) for _ in range(spec.num_envs)]
    return VectorEnvAdapter(
        envs, schema, max_episode_steps=spec.max_episode_steps or DEFAULT_MAX_EPISODE_STEPS
    )


register_env(
    "reach2d",
    "joynexus.envs.reach2d:make_reach2d",
    schema="joynexus.envs.reach2d:reach2d_schema",
    description="reach2d: move a point to a goal in 2-D (numpy; goal in the state; easy task)",
    requires=[],
    states=("default", "proprio"),
)
