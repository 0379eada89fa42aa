from __future__ import annotations

import numpy as np
import pytest

from joynexus.envs import EnvSpec, env_schema, list_envs, make_env
from joynexus.envs.reach2d import Reach2DScriptedPolicy, Reach2DSim
from joynexus.errors import SpecError


def test_registered_and_available() -> None:
    rows = {r.kind: r for r in list_envs()}
    assert rows["reach2d"].available
    schema = env_schema(EnvSpec(kind="reach2d", image_size=32))
    assert schema.state_dim == 4 and schema.action_dim == 2
    assert schema.cameras["top"].shape == (32, 32, 3)


def test_observation_shapes_and_state_holds_goal() -> None:
    env = make_env(EnvSpec(kind="reach2d", num_envs=3, image_size=32))
    obs = env.reset(seed=1)
    assert obs.cameras["top"].shape == (3, 32, 32, 3)
    assert obs.cameras["top"].dtype == np.uint8
    assert obs.state.shape == (3, 4)
    sim = env.envs[0]  # type: ignore[attr-defined]
    np.testing.assert_allclose(obs.state[0], np.r_[sim.agent, sim.goal], atol=1e-6)
    env.close()


def test_render_draws_agent_and_goal_where_they_are() -> None:
    sim = Reach2DSim(32)
    sim.reset(seed=0)
    sim.agent = np.array([-0.5, 0.5])
    sim.goal = np.array([0.5, -0.5])
    img = sim.render()
    # +y is up: the agent is in the top-left quadrant, the goal in the bottom-right.
    assert tuple(img[8, 8]) == (210, 40, 40)
    assert tuple(img[24, 24]) == (40, 170, 60)
    assert tuple(img[0, 31]) == (200, 200, 200)


def test_reward_is_negative_distance_and_reaching_succeeds() -> None:
    sim = Reach2DSim(16)
    sim.reset(seed=0)
    sim.agent = np.array([0.0, 0.0])
    sim.goal = np.array([0.5, 0.0])
    step = sim.step(np.array([1.0, 0.0]))
    assert step.reward == pytest.approx(-(0.5 - 0.15))
    assert not step.terminated
    sim.agent = np.array([0.45, 0.0])
    step = sim.step(np.array([0.3, 0.0]))
    assert step.success and step.terminated
    assert step.reward == pytest.approx(5.0 - abs(0.5 - 0.495), abs=1e-6)


def test_scripted_expert_reaches_the_goal_and_random_does_not() -> None:
    env = make_env(EnvSpec(kind="reach2d", num_envs=4, image_size=16))
    expert = Reach2DScriptedPolicy()
    obs = env.reset(seed=3)
    reached = np.zeros(4, bool)
    for _ in range(20):
        step = env.step(expert.act(env, obs))
        reached |= step.success
        obs = step.observation
    assert reached.all()
    env.close()


def test_episodes_truncate_and_seeds_reproduce() -> None:
    spec = EnvSpec(kind="reach2d", image_size=16, max_episode_steps=5)
    a, b = make_env(spec), make_env(spec)
    oa, ob = a.reset(seed=7), b.reset(seed=7)
    np.testing.assert_array_equal(oa.state, ob.state)
    for _ in range(5):
        step = a.step(np.zeros((1, 2), np.float32))
    assert step.truncated[0] and not step.terminated[0]
    a.close()
    b.close()


def test_bad_options_and_task_are_rejected() -> None:
    with pytest.raises(SpecError, match="allowed options"):
        env_schema(EnvSpec(kind="reach2d", options={"speed": 1}))
    with pytest.raises(SpecError, match="single task"):
        env_schema(EnvSpec(kind="reach2d", task="other"))
