"""Which reset seeds demonstrations, evaluations and grouped rollouts use.

A success rate measured on the initial states the policy was trained on says little
about the policy; evaluation therefore runs on fixed seeds of their own. Both sets are
contiguous ranges: a recording of ``E`` episodes from seed ``s`` resets episode ``k``
with ``s + k`` (:func:`demo_seeds`); an evaluation of ``n`` episodes from seed ``b``
resets episode ``j`` with ``b + j`` (:func:`eval_seeds`). Evaluation seeds start at
:data:`EVAL_SEED_BASE` unless a spec says otherwise, far above any demonstration seed
a spec's ``seed`` gives by default.

Grouped RL rollouts (GRPO with ``algorithm.group_size``: the sub-envs of one group start
from one initial state) draw their seeds from a range of their own,
``[TRAIN_SEED_BASE, 2**31)`` (:data:`TRAIN_SEEDS`), above every default evaluation and
demonstration seed; the spec refuses a ``success_eval`` whose seeds reach it. Each
rollout owns a block of ``num_groups × ROLLOUT_EPISODES`` seeds
(:func:`grouped_rollout_seed`): group ``g``'s ``k``-th episode of the rollout starts
from ``first + g + k · num_groups``, so groups and rollouts never share an initial state
(unless a sub-env runs more than :data:`ROLLOUT_EPISODES` episodes in one rollout, or
more rollouts than the range has blocks are produced, after which the blocks wrap).
"""

from __future__ import annotations

__all__ = [
    "EVAL_SEED_BASE",
    "ROLLOUT_EPISODES",
    "TRAIN_SEEDS",
    "TRAIN_SEED_BASE",
    "demo_seeds",
    "eval_seeds",
    "grouped_rollout_seed",
    "shared_seeds",
]

#: First evaluation seed unless declared.
EVAL_SEED_BASE = 1_000_000

#: First reset seed of grouped training rollouts.
TRAIN_SEED_BASE = 1 << 30

#: Every seed a grouped training rollout may use.
TRAIN_SEEDS = range(TRAIN_SEED_BASE, 1 << 31)

#: Episodes per sub-env a grouped rollout's seed block has room for.
ROLLOUT_EPISODES = 1024


def demo_seeds(seed: int, episodes: int) -> range:
    """The reset seeds of a recording of ``episodes`` episodes starting at ``seed``."""
    return range(seed, seed + episodes)


def eval_seeds(seed: int, episodes: int) -> range:
    """The reset seeds of an evaluation of ``episodes`` episodes starting at ``seed``."""
    return range(seed, seed + episodes)


def shared_seeds(a: range, b: range) -> range:
    """The seeds two contiguous ranges share (empty when disjoint)."""
    return range(max(a.start, b.start), min(a.stop, b.stop))


def grouped_rollout_seed(seed: int, rollout: int, num_groups: int) -> int:
    """The reset seed of a grouped rollout: group ``g`` starts from the result ``+ g``.

    Args:
        seed: The workload's ``seed``.
        rollout: The rollout's number (its job's creation sequence).
        num_groups: Groups of sub-envs in the rollout (``num_envs / group_size``).

    Returns:
        The first seed of the rollout's block in :data:`TRAIN_SEEDS`; the block holds
        ``num_groups × ROLLOUT_EPISODES`` seeds (see the module docstring).

    Raises:
        ValueError: ``num_groups`` < 1.
    """
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    span = num_groups * ROLLOUT_EPISODES
    blocks = len(TRAIN_SEEDS) // span
    return TRAIN_SEED_BASE + ((seed * 100_003 + rollout) % blocks) * span
