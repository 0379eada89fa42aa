import numpy as np
import pytest

from joynexus.algorithms.advantages import discounted_returns, gae, grpo
from joynexus.errors import InvalidRequestError


def test_discounted_returns_reset_at_done() -> None:
    rewards = np.array([[1.0], [1.0], [1.0], [1.0]], dtype=np.float32)
    dones = np.array([[0], [1], [0], [0]], dtype=bool)
    out = discounted_returns(rewards, dones, gamma=0.5)
    np.testing.assert_allclose(out[:, 0], [1.5, 1.0, 1.5, 1.0])


def test_gae_lambda_one_equals_mc_advantage() -> None:
    rng = np.random.default_rng(0)
    rewards = rng.standard_normal((6, 3)).astype(np.float32)
    values = rng.standard_normal((6, 3)).astype(np.float32)
    dones = np.zeros((6, 3), dtype=bool)
    dones[5] = True  # every episode ends at the horizon: no bootstrap
    adv, ret = gae(rewards, values, dones, np.zeros(3, np.float32), gamma=0.9, lam=1.0)
    mc = discounted_returns(rewards, dones, gamma=0.9)
    np.testing.assert_allclose(adv, mc - values, atol=1e-5)
    np.testing.assert_allclose(ret, mc, atol=1e-5)


def test_gae_lambda_zero_is_td_error_with_bootstrap() -> None:
    rewards = np.array([[1.0], [2.0]], dtype=np.float32)
    values = np.array([[0.5], [0.25]], dtype=np.float32)
    dones = np.zeros((2, 1), dtype=bool)
    last = np.array([4.0], dtype=np.float32)
    adv, _ = gae(rewards, values, dones, last, gamma=0.5, lam=0.0)
    np.testing.assert_allclose(adv[:, 0], [1.0 + 0.5 * 0.25 - 0.5, 2.0 + 0.5 * 4.0 - 0.25])


def test_grpo_normalizes_within_groups() -> None:
    rewards = np.zeros((3, 4), dtype=np.float32)
    rewards[2] = [1.0, 0.0, 3.0, 5.0]
    dones = np.zeros((3, 4), dtype=bool)
    adv, ret = grpo(rewards, dones, group_ids=np.array([0, 0, 1, 1]))
    np.testing.assert_allclose(ret[0], [1.0, 0.0, 3.0, 5.0])
    # Two episodes per group → normalized returns are exactly ±1.
    np.testing.assert_allclose(adv[0], [1.0, -1.0, -1.0, 1.0], atol=1e-4)
    assert np.all(adv[0] == adv[2])  # every step carries its episode's advantage


def test_grpo_splits_episodes_at_done() -> None:
    rewards = np.array([[1.0], [0.0], [0.0], [3.0]], dtype=np.float32)
    dones = np.array([[0], [1], [0], [0]], dtype=bool)
    adv, ret = grpo(rewards, dones)
    np.testing.assert_allclose(ret[:, 0], [1.0, 1.0, 3.0, 3.0])
    assert adv[0, 0] < 0 < adv[3, 0]


def test_shape_errors_name_the_field() -> None:
    with pytest.raises(InvalidRequestError, match="values"):
        gae(np.zeros((2, 2)), np.zeros((3, 2)), np.zeros((2, 2), bool), np.zeros(2))
    with pytest.raises(InvalidRequestError, match="last_values"):
        gae(np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2), bool), np.zeros(3))


def test_grpo_gives_a_group_that_all_succeeded_zero_advantage() -> None:
    # Binary success: group 0 all succeed, group 1 half do, group 2 all fail.
    rewards = np.zeros((4, 6), dtype=np.float32)
    rewards[3] = [1, 1, 1, 0, 0, 0]
    dones = np.zeros((4, 6), dtype=bool)
    dones[3] = True
    adv, ret = grpo(rewards, dones, group_ids=np.array([0, 0, 1, 1, 2, 2]))
    np.testing.assert_allclose(ret[0], [1, 1, 1, 0, 0, 0])
    np.testing.assert_allclose(adv[:, :2], 0.0)
    np.testing.assert_allclose(adv[:, 4:], 0.0)
    np.testing.assert_allclose(adv[0, 2:4], [1.0, -1.0], atol=1e-4)
    # Ungrouped, the same episodes are compared across the groups' initial states.
    ungrouped, _ = grpo(rewards, dones)
    assert ungrouped[0, 0] > 0 > ungrouped[0, 5]


def test_grpo_groups_later_episodes_by_ordinal() -> None:
    # Group 0 = envs 0, 1. Env 0 succeeds at t=1 and starts a second episode (it fails);
    # env 1 fails its first episode, which runs to the horizon.
    rewards = np.zeros((4, 2), dtype=np.float32)
    rewards[1, 0] = 1.0
    dones = np.zeros((4, 2), dtype=bool)
    dones[1, 0] = True
    adv, ret = grpo(rewards, dones, group_ids=np.array([0, 0]))
    np.testing.assert_allclose(ret[:, 0], [1, 1, 0, 0])
    # First episodes compared with each other only: +1 / -1.
    np.testing.assert_allclose(adv[:2, 0], 1.0, atol=1e-4)
    np.testing.assert_allclose(adv[:, 1], -1.0, atol=1e-4)
    # Env 0's second episode is alone in (group 0, ordinal 1): zero advantage.
    np.testing.assert_allclose(adv[2:, 0], 0.0)


def test_grpo_group_ids_must_match_the_envs() -> None:
    with pytest.raises(InvalidRequestError, match="group_ids"):
        grpo(np.zeros((2, 3)), np.zeros((2, 3), bool), group_ids=np.zeros(2, np.int64))
