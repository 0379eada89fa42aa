"""ManiSkill3 adapter: schema without a simulator, then one real PickCube env (CPU backend)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from joynexus.envs import EnvAdapter, EnvSpec, env_schema, list_envs, make_env
from joynexus.envs.maniskill import CONTROL_MODES, TASKS
from joynexus.errors import SchemaMismatchError, SpecError

SIZE = 32


def test_registered_with_requirements() -> None:
    rows = {row.kind: row for row in list_envs()}
    assert "maniskill" in rows
    assert rows["maniskill"].available, rows["maniskill"].reason


@pytest.mark.parametrize("task", sorted(TASKS))
def test_schema_per_task(task: str) -> None:
    schema = env_schema(EnvSpec(kind="maniskill", task=task, image_size=SIZE))
    assert schema.camera_names == list(TASKS[task].cameras)
    assert all(cam.shape == (SIZE, SIZE, 3) for cam in schema.cameras.values())
    assert schema.state_dim == 18 + TASKS[task].extra_dim
    assert schema.action_dim == 7  # default controller: end-effector delta pose + gripper
    assert schema.instruction


@pytest.mark.parametrize("mode", sorted(CONTROL_MODES))
def test_action_dim_follows_control_mode(mode: str) -> None:
    spec = EnvSpec(kind="maniskill", task="PushCube-v1", options={"control_mode": mode})
    assert env_schema(spec).action_dim == CONTROL_MODES[mode]


@pytest.mark.parametrize(
    ("task", "options", "needle"),
    [
        ("PickSingleYCB-v1", {}, "not supported"),
        ("PickCube-v1", {"control_mode": "teleport"}, "control_mode"),
        ("PickCube-v1", {"reward_mode": "shaped"}, "reward_mode"),
        ("PickCube-v1", {"fps": 3}, "unknown maniskill option"),
    ],
)
def test_bad_specs_are_rejected(task: str, options: dict[str, object], needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        env_schema(EnvSpec(kind="maniskill", task=task, options=options))


@pytest.fixture(scope="module")
def env() -> Iterator[EnvAdapter]:
    adapter = make_env(
        EnvSpec(kind="maniskill", task="PickCube-v1", image_size=SIZE, max_episode_steps=3)
    )
    yield adapter
    adapter.close()


def test_reset_matches_schema(env: EnvAdapter) -> None:
    obs = env.reset(seed=0)
    assert set(obs.cameras) == {"base_camera"}
    frame = obs.cameras["base_camera"]
    assert frame.shape == (1, SIZE, SIZE, 3) and frame.dtype == np.uint8
    assert frame.std() > 0  # a rendered scene, not a blank buffer
    assert obs.state.shape == (1, env.schema.state_dim) and obs.state.dtype == np.float32
    assert obs.instruction == env.schema.instruction


def test_same_seed_same_scene(env: EnvAdapter) -> None:
    first = env.reset(seed=7)
    again = env.reset(seed=7)
    other = env.reset(seed=8)
    np.testing.assert_array_equal(first.state, again.state)
    # PickCube's goal position (last 3 state values) is drawn from the seed.
    assert not np.allclose(first.state[0, -3:], other.state[0, -3:])


def test_steps_move_the_arm_and_truncate(env: EnvAdapter) -> None:
    obs = env.reset(seed=1)
    action = np.zeros((1, env.schema.action_dim), np.float32)
    action[0, 2] = 1.0  # end effector up
    results = [env.step(action) for _ in range(3)]
    assert not np.allclose(results[0].observation.state[0, :9], obs.state[0, :9])
    for res in results:
        assert res.reward.shape == (1,) and res.reward.dtype == np.float32
        assert res.success.dtype == bool and not res.success[0]
    assert not results[0].truncated[0] and not results[1].truncated[0]
    assert results[2].truncated[0]
    # Auto-reset: the returned observation already starts the next episode.
    assert "final_observation" in results[2].info


def test_wrong_action_shape(env: EnvAdapter) -> None:
    env.reset(seed=0)
    with pytest.raises(SchemaMismatchError):
        env.step(np.zeros((1, 3), np.float32))
