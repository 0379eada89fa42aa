"""Which reset seeds demonstrations and evaluations use, and that they never meet.

A success rate measured on the initial states the policy was trained on says little
about the policy; evaluation therefore runs on fixed seeds of their own. Both sets are
contiguous ranges: a recording of ``E`` episodes from seed ``s`` resets episode ``k``
with ``s + k`` (:func:`demo_seeds`); an evaluation of ``n`` episodes from seed ``b``
resets episode ``j`` with ``b + j`` (:func:`eval_seeds`). Evaluation seeds start at
:data:`EVAL_SEED_BASE` unless a spec says otherwise, far above any demonstration seed
a spec's ``seed`` gives by default.
"""

from __future__ import annotations

__all__ = ["EVAL_SEED_BASE", "demo_seeds", "eval_seeds", "shared_seeds"]

#: First evaluation seed unless declared.
EVAL_SEED_BASE = 1_000_000


def demo_seeds(seed: int, episodes: int) -> range:
    """The reset seeds of a recording of ``episodes`` episodes starting at ``seed``."""
    return range(seed, seed + episodes)


def eval_seeds(seed: int, episodes: int) -> range:
    """The reset seeds of an evaluation of ``episodes`` episodes starting at ``seed``."""
    return range(seed, seed + episodes)


def shared_seeds(a: range, b: range) -> range:
    """The seeds two contiguous ranges share (empty when disjoint)."""
    return range(max(a.start, b.start), min(a.stop, b.stop))
