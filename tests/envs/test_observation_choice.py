"""``EnvSpec.observation``: images on or off, and which state, where a kind offers it."""

from __future__ import annotations

import numpy as np
import pytest

from joynexus.envs import EnvSpec, env_schema, make_env
from joynexus.errors import SpecError


def test_kinds_refuse_choices_they_do_not_offer() -> None:
    with pytest.raises(SpecError, match=r"always renders.*metaworld"):
        env_schema(EnvSpec(kind="reach2d", observation={"images": False}))
    with pytest.raises(SpecError, match=r"offers observation\.state"):
        env_schema(EnvSpec(kind="pusht", observation={"state": "privileged"}))
    with pytest.raises(SpecError, match=r"offers observation\.state"):
        make_env(EnvSpec(kind="reach2d", observation={"state": "privileged"}))
    with pytest.raises(ValueError, match="state"):
        EnvSpec(kind="metaworld", observation={"state": "everything"})


@pytest.mark.filterwarnings("ignore:Constant:UserWarning")
def test_metaworld_without_images_keeps_the_state_and_a_black_frame() -> None:
    pytest.importorskip("metaworld")
    kw = {"kind": "metaworld", "task": "push-v3", "image_size": 16}
    full = EnvSpec(**kw)
    blind = EnvSpec(**kw, observation={"images": False})
    proprio = EnvSpec(**kw, observation={"images": False, "state": "proprio"})
    assert env_schema(blind) == env_schema(full)  # same interface, nothing rendered
    assert env_schema(proprio).state_dim == 4
    envs = [make_env(s) for s in (full, blind, proprio)]
    try:
        obs = [e.reset(seed=5) for e in envs]
        np.testing.assert_array_equal(obs[0].state, obs[1].state)
        np.testing.assert_array_equal(obs[2].state, obs[0].state[:, :4])  # hand xyz, gripper
        assert obs[0].cameras["corner"].any()
        assert obs[1].cameras["corner"].shape == (1, 16, 16, 3)
        assert not obs[1].cameras["corner"].any()
    finally:
        for e in envs:
            e.close()


@pytest.mark.parametrize(
    ("task", "state", "dim"),
    [
        ("PickCube-v1", "privileged", 42),
        ("PushCube-v1", "privileged", 35),
        ("StackCube-v1", "privileged", 48),
        ("PickCube-v1", "proprio", 18),
        ("PickCube-v1", "default", 29),
    ],
)
def test_maniskill_state_choices(task: str, state: str, dim: int) -> None:
    spec = EnvSpec(kind="maniskill", task=task, observation={"images": False, "state": state})
    assert env_schema(spec).state_dim == dim


def test_maniskill_privileged_state_renders_nothing() -> None:
    with pytest.raises(SpecError, match="images to false"):
        env_schema(
            EnvSpec(kind="maniskill", task="PushCube-v1", observation={"state": "privileged"})
        )


def test_maniskill_privileged_state_holds_the_cube_pose() -> None:
    pytest.importorskip("mani_skill")
    spec = EnvSpec(
        kind="maniskill",
        task="PushCube-v1",
        image_size=8,
        observation={"images": False, "state": "privileged"},
    )
    env = make_env(spec)
    try:
        obs = env.reset(seed=3)
        assert obs.state.shape == (1, 35) and not obs.cameras["base_camera"].any()
        cube = env.envs[0].env.unwrapped.obj.pose.p.numpy()[0]  # type: ignore[attr-defined]
        # qpos 9, qvel 9, tcp_pose 7, goal_pos 3, then obj_pose: position first.
        np.testing.assert_allclose(obs.state[0, 28:31], cube, atol=1e-5)
    finally:
        env.close()


def test_reach2d_proprio_hides_the_goal_from_the_state_and_its_expert_still_reaches_it() -> None:
    from joynexus.data.record import make_scripted_policy

    full = EnvSpec(kind="reach2d", image_size=32, num_envs=3)
    proprio = EnvSpec(kind="reach2d", image_size=32, num_envs=3, observation={"state": "proprio"})
    assert env_schema(proprio).state_dim == 2
    envs = [make_env(s) for s in (full, proprio)]
    try:
        obs = [e.reset(seed=7) for e in envs]
        # Only the agent's position: the goal is in the image alone.
        np.testing.assert_array_equal(obs[1].state, obs[0].state[:, :2])
        np.testing.assert_array_equal(obs[1].cameras["top"], obs[0].cameras["top"])
        expert = make_scripted_policy(proprio)
        np.testing.assert_allclose(
            expert.act(envs[1], obs[1]), make_scripted_policy(full).act(envs[0], obs[0])
        )
        done = np.zeros(3, bool)
        o = obs[1]
        for _ in range(30):
            step = envs[1].step(expert.act(envs[1], o))
            o, done = step.observation, done | step.success
        assert done.all()
    finally:
        for e in envs:
            e.close()
