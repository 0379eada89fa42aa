"""Test-only env kinds, importable by spawned worker processes.

``fake``: a tiny deterministic simulator. State is ``[step, seed, last action[0]]``; the
camera is filled with ``step % 256``. Options: ``episode_len`` (terminate after this many
steps, success when the last action's first component is positive), ``crash_at`` (the
worker process exits abruptly on that step) and ``hang_at`` (the step never returns).
"""

from __future__ import annotations

import os
import time

import numpy as np

from joynexus.envs.base import EnvAdapter, EnvSpec
from joynexus.envs.registry import register_env
from joynexus.envs.vector import SingleEnv, SingleObservation, SingleStep, VectorEnvAdapter
from joynexus.models.schema import CameraSpec, DataSchema

KIND = "fake"
FACTORY = "tests.envs.fake_envs:make_fake"
SCHEMA = "tests.envs.fake_envs:fake_schema"


def fake_schema(spec: EnvSpec) -> DataSchema:
    size = spec.image_size or 8
    return DataSchema(
        name="fake",
        cameras={"cam": CameraSpec(height=size, width=size)},
        state_dim=3,
        action_dim=2,
        instruction="do the fake thing",
    )


class FakeSingle:
    def __init__(self, size: int, options: dict[str, int]) -> None:
        self.size = size
        self.options = options
        self.t = 0
        self.seed = -1.0
        self.total_steps = 0

    def _obs(self, last: float) -> SingleObservation:
        frame = np.full((self.size, self.size, 3), self.t % 256, np.uint8)
        return SingleObservation(
            cameras={"cam": frame}, state=np.array([self.t, self.seed, last], np.float32)
        )

    def reset(self, seed: int | None) -> SingleObservation:
        self.t = 0
        self.seed = -1.0 if seed is None else float(seed)
        return self._obs(0.0)

    def step(self, action: np.ndarray) -> SingleStep:
        self.t += 1
        self.total_steps += 1
        if self.options.get("crash_at") == self.total_steps:
            os._exit(3)
        if self.options.get("hang_at") == self.total_steps:
            time.sleep(3600)
        episode_len = self.options.get("episode_len", 1_000_000)
        done = self.t >= episode_len
        return SingleStep(
            observation=self._obs(float(action[0])),
            reward=float(action[0]),
            terminated=done,
            truncated=False,
            success=bool(done and action[0] > 0),
        )

    def close(self) -> None:
        pass


def make_fake(spec: EnvSpec) -> EnvAdapter:
    schema = fake_schema(spec)
    size = schema.cameras["cam"].height
    envs: list[SingleEnv] = [FakeSingle(size, dict(spec.options)) for _ in range(spec.num_envs)]
    return VectorEnvAdapter(envs, schema, max_episode_steps=spec.max_episode_steps)


def ensure_registered() -> None:
    register_env(KIND, FACTORY, schema=SCHEMA, description="test env", replace=True)
