"""MetaWorld adapter: MT1 task with a camera, fast rendering, success from info."""

from __future__ import annotations

import numpy as np
import pytest

from joynexus.envs import EnvSpec, make_env
from joynexus.errors import SpecError

pytest.importorskip("metaworld")


@pytest.mark.filterwarnings("ignore:Constant:UserWarning")  # the expert's own gain warning
def test_metaworld_reach_succeeds_with_the_scripted_expert() -> None:
    from metaworld.policies import SawyerReachV3Policy

    env = make_env(EnvSpec(kind="metaworld", task="reach-v3", num_envs=2, image_size=32))
    policy = SawyerReachV3Policy()  # type: ignore[no-untyped-call]
    try:
        obs = env.reset(seed=0)
        assert obs.cameras["corner"].shape == (2, 32, 32, 3)
        assert obs.cameras["corner"].std() > 5  # a rendered scene, not a blank frame
        assert obs.state.shape == (2, 39) and obs.instruction == "reach"
        succeeded = np.zeros(2, bool)
        for _ in range(150):
            acts = np.stack([policy.get_action(s) for s in obs.state]).astype(np.float32)
            step = env.step(acts)
            succeeded |= step.success
            # success terminates the episode by default (evaluation semantics)
            assert np.array_equal(step.terminated, step.success)
            obs = step.observation
            if succeeded.all():
                break
        assert succeeded.all()
    finally:
        env.close()


def test_metaworld_fast_render_off_still_renders_and_seeds_pick_goals() -> None:
    slow = make_env(EnvSpec(kind="metaworld", task="reach-v3", image_size=24, fast_render=False))
    try:
        first = slow.reset(seed=1)
        again = slow.reset(seed=1)
        other = slow.reset(seed=2)
        assert first.cameras["corner"].std() > 5
        np.testing.assert_array_equal(first.state, again.state)
        assert not np.array_equal(first.state[:, 36:], other.state[:, 36:])  # goal differs
    finally:
        slow.close()
    with pytest.raises(SpecError, match="unknown MetaWorld MT1 task"):
        make_env(EnvSpec(kind="metaworld", task="fly-to-moon-v3", image_size=8))


@pytest.mark.filterwarnings("ignore:Constant:UserWarning")
def test_sparse_reward_is_the_success_and_a_bad_reward_mode_is_refused() -> None:
    from metaworld.policies import SawyerReachV3Policy

    spec = EnvSpec(
        kind="metaworld",
        task="reach-v3",
        num_envs=1,
        image_size=8,
        options={"reward_mode": "sparse"},
        observation={"images": False},
    )
    env = make_env(spec)
    policy = SawyerReachV3Policy()  # type: ignore[no-untyped-call]
    rewards: list[float] = []
    try:
        obs = env.reset(seed=0)
        for _ in range(150):
            step = env.step(np.stack([policy.get_action(s) for s in obs.state]))
            rewards.append(float(step.reward[0]))
            obs = step.observation
            if step.success[0]:
                break
    finally:
        env.close()
    # 0 until the successful step, which ends the episode with reward 1: return = success.
    assert rewards[-1] == 1.0 and set(rewards[:-1]) == {0.0}
    with pytest.raises(SpecError, match="reward_mode 'shaped'"):
        make_env(spec.model_copy(update={"options": {"reward_mode": "shaped"}}))
