"""VectorEnvAdapter: stacking, seeding, same-step auto-reset, truncation, action checks."""

from __future__ import annotations

import numpy as np
import pytest

from joynexus.envs import EnvObservation, EnvSpec, make_env
from joynexus.errors import SchemaMismatchError


def test_same_step_autoreset_and_final_observation() -> None:
    env = make_env(EnvSpec(kind="fake", num_envs=2, options={"episode_len": 2}))
    obs = env.reset(seed=5)
    assert obs.state[:, 1].tolist() == [5.0, 6.0]
    first = env.step(np.array([[1.0, 0], [1.0, 0]]))
    assert not first.terminated.any() and "final_observation" not in first.info
    second = env.step(np.array([[1.0, 0], [-1.0, 0]]))
    assert second.terminated.tolist() == [True, True]
    assert second.success.tolist() == [True, False]
    # the returned observation is already the next episode's first one ...
    assert second.observation.state[:, 0].tolist() == [0.0, 0.0]
    # ... seeded deterministically (seed + i + num_envs) ...
    assert second.observation.state[:, 1].tolist() == [7.0, 8.0]
    # ... and the finished episode's last observation is kept in info.
    final = second.info["final_observation"]
    assert isinstance(final, EnvObservation)
    assert final.state[:, 0].tolist() == [2.0, 2.0]
    assert final.cameras["cam"][0, 0, 0, 0] == 2
    env.close()
    env.close()  # idempotent


def test_max_episode_steps_truncates() -> None:
    env = make_env(EnvSpec(kind="fake", max_episode_steps=3))
    env.reset(seed=0)
    flags = [env.step(np.zeros((1, 2))).truncated[0] for _ in range(7)]
    assert flags == [False, False, True, False, False, True, False]


def test_step_before_reset_resets_first_and_bad_actions_fail() -> None:
    env = make_env(EnvSpec(kind="fake", num_envs=3, image_size=5))
    step = env.step(np.zeros((3, 2)))
    assert step.observation.cameras["cam"].shape == (3, 5, 5, 3)
    with pytest.raises(SchemaMismatchError, match=r"\[num_envs=3, action_dim=2\]"):
        env.step(np.zeros((2, 2)))
    with pytest.raises(SchemaMismatchError, match="NaN"):
        env.step(np.full((3, 2), np.nan))
