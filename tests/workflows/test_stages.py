from __future__ import annotations

import numpy as np
import pytest

from joynexus.algorithms.advantages import discounted_returns, gae, grpo
from joynexus.errors import InvalidRequestError
from joynexus.spec.workload import AlgorithmSpec
from joynexus.workflows.stages import compute_advantages


def _flat(
    rng: np.random.Generator, horizon: int, n: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    tm = {
        "rewards": rng.normal(size=(horizon, n)).astype(np.float32),
        "values": rng.normal(size=(horizon, n)).astype(np.float32),
        "dones": rng.random((horizon, n)) < 0.2,
    }
    boot = rng.normal(size=n).astype(np.float32)
    t = np.repeat(np.arange(horizon), n)
    env = np.tile(np.arange(n), horizon)
    flat = {k: v[t, env] for k, v in tm.items()}
    flat.update(t=t, env=env, bootstrap_values=boot[env])
    tm["boot"] = boot
    return flat, tm


def test_gae_on_flattened_samples_matches_time_major() -> None:
    rng = np.random.default_rng(0)
    flat, tm = _flat(rng, 7, 3)
    # Shuffle the rows: the stage must reshape by t/env, not by position.
    perm = rng.permutation(21)
    shuffled = {k: v[perm] for k, v in flat.items()}
    algo = AlgorithmSpec(name="ppo", gamma=0.9, gae_lambda=0.8)
    out = compute_advantages(shuffled, algo)
    adv, ret = gae(tm["rewards"], tm["values"], tm["dones"], tm["boot"], gamma=0.9, lam=0.8)
    np.testing.assert_allclose(out["advantages"], adv[shuffled["t"], shuffled["env"]], rtol=1e-5)
    np.testing.assert_allclose(out["returns"], ret[shuffled["t"], shuffled["env"]], rtol=1e-5)


def test_actor_values_replace_behaviour_values() -> None:
    rng = np.random.default_rng(1)
    flat, tm = _flat(rng, 4, 2)
    flat["actor_values"] = np.zeros(8, np.float32)
    out = compute_advantages(flat, AlgorithmSpec(name="ppo"))
    adv, _ = gae(tm["rewards"], np.zeros((4, 2), np.float32), tm["dones"], tm["boot"])
    np.testing.assert_allclose(out["advantages"], adv[flat["t"], flat["env"]], rtol=1e-5)


def test_grpo_and_reinforce_estimators() -> None:
    rng = np.random.default_rng(2)
    flat, tm = _flat(rng, 5, 4)
    g = compute_advantages(flat, AlgorithmSpec(name="grpo"))
    adv, _ = grpo(tm["rewards"], tm["dones"])
    np.testing.assert_allclose(g["advantages"], adv[flat["t"], flat["env"]], rtol=1e-5)
    r = compute_advantages(flat, AlgorithmSpec(name="reinforce", gamma=0.5))
    ret = discounted_returns(tm["rewards"], tm["dones"], gamma=0.5)
    np.testing.assert_allclose(r["returns"], ret[flat["t"], flat["env"]], rtol=1e-5)
    assert abs(float(r["advantages"].mean())) < 1e-5


def test_samples_must_tile_the_grid() -> None:
    rng = np.random.default_rng(3)
    flat, _ = _flat(rng, 3, 2)
    broken = {k: v[:-1] for k, v in flat.items()}
    with pytest.raises(InvalidRequestError, match="do not tile"):
        compute_advantages(broken, AlgorithmSpec(name="ppo"))


def test_grpo_normalizes_within_the_groups_the_rollout_carries() -> None:
    # 4 envs in 2 groups, one episode each (binary success at the last step).
    horizon, n = 3, 4
    t = np.repeat(np.arange(horizon), n)
    env = np.tile(np.arange(n), horizon)
    rewards = np.zeros((horizon, n), np.float32)
    rewards[-1] = [1.0, 1.0, 1.0, 0.0]
    flat = {
        "rewards": rewards[t, env],
        "dones": np.zeros(t.size, bool),
        "t": t,
        "env": env,
        "group": env // 2,
    }
    out = compute_advantages(flat, AlgorithmSpec(name="grpo", group_size=2))
    adv = out["advantages"].reshape(horizon, n)
    np.testing.assert_allclose(adv[:, :2], 0.0)  # the group where all succeeded
    np.testing.assert_allclose(adv[:, 2:], np.tile([1.0, -1.0], (horizon, 1)), atol=1e-4)
    # Without the rollout's groups the same returns are compared across groups.
    legacy = compute_advantages(
        {k: v for k, v in flat.items() if k != "group"}, AlgorithmSpec(name="grpo")
    )
    assert legacy["advantages"][0] > 0


def test_a_grouped_tenant_needs_a_grouped_rollout() -> None:
    t = np.repeat(np.arange(2), 2)
    env = np.tile(np.arange(2), 2)
    flat = {"rewards": np.zeros(4, np.float32), "dones": np.zeros(4, bool), "t": t, "env": env}
    with pytest.raises(InvalidRequestError, match="carries no 'group' field"):
        compute_advantages(flat, AlgorithmSpec(name="grpo", group_size=2))
    with pytest.raises(InvalidRequestError, match="not constant per env"):
        compute_advantages({**flat, "group": np.array([0, 0, 1, 0])}, AlgorithmSpec(name="grpo"))
