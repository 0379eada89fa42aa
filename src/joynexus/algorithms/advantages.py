"""Advantage and return estimators of the RL advantage stage (paper App. A.5).

All functions take time-major arrays ``[T, N]`` (T steps of N parallel envs), as a
rollout partition stores them, and return arrays of the same shape. ``dones[t, n]``
is true when the episode of env ``n`` ended at step ``t`` (terminated or truncated);
the value after a done is never bootstrapped across the boundary.

The estimator changes the numbers, never the scheduling protocol: the advantage stage
reads these inputs with ``get_meta``/``get_data`` and writes ``advantages`` and
``returns`` back with ``put`` against the same samples.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from joynexus.errors import InvalidRequestError

FloatArray = npt.NDArray[np.float32]


def _check(rewards: np.ndarray, dones: np.ndarray, name: str, other: np.ndarray) -> None:
    if rewards.ndim != 2:
        raise InvalidRequestError(
            f"rewards must be time-major [T, N], got shape {tuple(rewards.shape)}",
            field="rewards",
        )
    if other.shape != rewards.shape:
        raise InvalidRequestError(
            f"{name} must have the shape of rewards {tuple(rewards.shape)}, "
            f"got {tuple(other.shape)}",
            field=name,
        )
    if dones.shape != rewards.shape:
        raise InvalidRequestError(
            f"dones must have the shape of rewards {tuple(rewards.shape)}, "
            f"got {tuple(dones.shape)}",
            field="dones",
        )


def discounted_returns(
    rewards: np.ndarray, dones: np.ndarray, *, gamma: float = 0.99
) -> FloatArray:
    """Discounted reward-to-go, reset at episode ends; no bootstrap past the horizon.

    Args:
        rewards: ``[T, N]`` rewards.
        dones: ``[T, N]`` episode-ended flags.
        gamma: Discount factor in [0, 1].
    """
    _check(rewards, dones, "rewards", rewards)
    out = np.zeros(rewards.shape, dtype=np.float32)
    running = np.zeros(rewards.shape[1], dtype=np.float64)
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] + gamma * running * (1.0 - dones[t].astype(np.float64))
        out[t] = running
    return out


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    dones: np.ndarray,
    last_values: np.ndarray,
    *,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[FloatArray, FloatArray]:
    """Generalized advantage estimation (Schulman et al., 2016).

    Args:
        rewards: ``[T, N]`` rewards.
        values: ``[T, N]`` critic values of the visited states.
        dones: ``[T, N]`` episode-ended flags.
        last_values: ``[N]`` value of the state after the last step (bootstrap for
            episodes still running at the horizon).
        gamma: Discount factor.
        lam: GAE smoothing in [0, 1]; 1 gives Monte-Carlo advantages, 0 gives TD(0).

    Returns:
        ``(advantages, returns)`` with ``returns = advantages + values``.

    Raises:
        InvalidRequestError: When shapes disagree.
    """
    _check(rewards, dones, "values", values)
    if last_values.shape != (rewards.shape[1],):
        raise InvalidRequestError(
            f"last_values must have shape ({rewards.shape[1]},), got {tuple(last_values.shape)}",
            field="last_values",
        )
    horizon = rewards.shape[0]
    adv = np.zeros(rewards.shape, dtype=np.float32)
    running = np.zeros(rewards.shape[1], dtype=np.float64)
    for t in range(horizon - 1, -1, -1):
        not_done = 1.0 - dones[t].astype(np.float64)
        next_value = last_values if t == horizon - 1 else values[t + 1]
        delta = rewards[t] + gamma * next_value * not_done - values[t]
        running = delta + gamma * lam * not_done * running
        adv[t] = running
    return adv, (adv + values).astype(np.float32)


def grpo(
    rewards: np.ndarray,
    dones: np.ndarray,
    *,
    group_ids: np.ndarray | None = None,
    eps: float = 1e-6,
) -> tuple[FloatArray, FloatArray]:
    """Group-relative advantages: each episode's return normalized within its group.

    Every step of an episode gets that episode's normalized return as advantage,
    ``(R - mean) / (std + eps)`` over the episodes of its group. An episode is a maximal
    run of steps of one env ending at a done (or the horizon).

    Groups: with ``group_ids`` (``[N]``, the envs that started the rollout from one
    initial state share an id), the ``k``-th episode of env ``n`` belongs to group
    ``(group_ids[n], k)``: the first episodes of a group's envs are the group's tries
    from its initial state, and a grouped env session starts their ``k``-th episodes
    from one seed too (:mod:`joynexus.envs.base`). A group whose episodes all have the
    same return (all succeeded, or all failed) gets zero advantage, and so does an
    episode alone in its group. Without ``group_ids`` every episode of the rollout is
    in one group (envs that started from different states compared with each other).

    Returns:
        ``(advantages, returns)`` where ``returns`` holds the undiscounted episode return.

    Raises:
        InvalidRequestError: Shapes disagree.
    """
    _check(rewards, dones, "rewards", rewards)
    horizon, num_envs = rewards.shape
    by_ordinal = group_ids is not None
    if group_ids is None:
        group_ids = np.zeros(num_envs, dtype=np.int64)
    group_ids = np.asarray(group_ids)
    if group_ids.shape != (num_envs,):
        raise InvalidRequestError(
            f"group_ids must have shape ({num_envs},), got {tuple(group_ids.shape)}",
            field="group_ids",
        )
    # Label every step with its episode, then sum rewards per episode.
    episode_of = np.zeros((horizon, num_envs), dtype=np.int64)
    episode_returns: list[float] = []
    episode_group: list[tuple[int, int]] = []
    for n in range(num_envs):
        start, ordinal = 0, 0
        for t in range(horizon):
            if dones[t, n] or t == horizon - 1:
                episode_of[start : t + 1, n] = len(episode_returns)
                episode_returns.append(float(rewards[start : t + 1, n].sum()))
                episode_group.append((int(group_ids[n]), ordinal if by_ordinal else 0))
                start, ordinal = t + 1, ordinal + 1
    ep_ret = np.asarray(episode_returns, dtype=np.float64)
    norm = np.zeros_like(ep_ret)
    members: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(episode_group):
        members.setdefault(key, []).append(i)
    for idx in members.values():
        sel = np.asarray(idx)
        mean, std = ep_ret[sel].mean(), ep_ret[sel].std()
        norm[sel] = (ep_ret[sel] - mean) / (std + eps)
    return norm[episode_of].astype(np.float32), ep_ret[episode_of].astype(np.float32)
