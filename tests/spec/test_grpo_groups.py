"""``algorithm.group_size``: GRPO's groups of rollouts per initial state in the spec."""

from __future__ import annotations

from typing import Any

import pytest

from joynexus.envs.seeds import (
    EVAL_SEED_BASE,
    ROLLOUT_EPISODES,
    TRAIN_SEEDS,
    eval_seeds,
    grouped_rollout_seed,
    shared_seeds,
)
from joynexus.errors import SpecError
from joynexus.spec.workload import parse_spec


def _rl(num_envs: int = 8, **algorithm: Any) -> dict[str, Any]:
    return {
        "tenant": "a",
        "task": "rl",
        "base_model": {"id": "tiny:qwen2_5_vl"},
        "env": {"kind": "reach2d", "num_envs": num_envs},
        "algorithm": {"name": "grpo", **algorithm},
    }


def test_group_size_is_unset_by_default_and_accepted_when_it_divides_num_envs() -> None:
    assert parse_spec(_rl()).algorithm.group_size is None
    assert parse_spec(_rl(group_size=4)).algorithm.group_size == 4
    assert parse_spec(_rl(num_envs=4, group_size=4)).algorithm.group_size == 4


def test_a_group_size_that_does_not_divide_num_envs_names_both_and_the_fix() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_rl(num_envs=6, group_size=4))
    message = str(info.value)
    assert "algorithm.group_size=4 does not divide env.num_envs=6" in message
    assert "set env.num_envs to a multiple of 4 (e.g. 8)" in message
    assert "group_size to a divisor of 6 (2, 3, 6)" in message
    with pytest.raises(SpecError, match=r"env\.num_envs=1.*none >= 2"):
        parse_spec(_rl(num_envs=1, group_size=2))


@pytest.mark.parametrize("size", [0, 1, 1025])
def test_group_sizes_out_of_range_are_refused(size: int) -> None:
    with pytest.raises(SpecError, match=r"algorithm\.group_size"):
        parse_spec(_rl(num_envs=1024, group_size=size))


@pytest.mark.parametrize("name", ["ppo", "reinforce"])
def test_group_size_belongs_to_grpo(name: str) -> None:
    with pytest.raises(SpecError, match=f"group_size belongs to grpo.*{name!r} does not use"):
        parse_spec(_rl(group_size=2) | {"algorithm": {"name": name, "group_size": 2}})


def test_success_eval_seeds_must_stay_out_of_the_training_seeds() -> None:
    ok = parse_spec(_rl(group_size=2) | {"success_eval": {"episodes": 50}})
    assert ok.success_eval is not None and ok.success_eval.seed == EVAL_SEED_BASE
    clash = {"success_eval": {"episodes": 50, "seed": TRAIN_SEEDS.start + 3}}
    with pytest.raises(SpecError, match="meet the seeds grouped rollouts train on"):
        parse_spec(_rl(group_size=2) | clash)
    assert parse_spec(_rl() | clash).success_eval is not None  # ungrouped: not its seeds


def test_grouped_rollout_seeds_differ_across_groups_and_rollouts_and_miss_evaluation() -> None:
    groups = 4
    used: set[int] = set()
    for seed in (0, 1):
        for rollout in range(1, 200):
            first = grouped_rollout_seed(seed, rollout, groups)
            # Every seed of the rollout's block: group g's k-th episode.
            block = range(first, first + groups * ROLLOUT_EPISODES)
            assert block.start >= TRAIN_SEEDS.start and block.stop <= TRAIN_SEEDS.stop
            assert not len(shared_seeds(block, eval_seeds(EVAL_SEED_BASE, 10_000)))
            starts = {first + g for g in range(groups)}
            assert not starts & used  # a new initial state for every group of every rollout
            used |= set(block)
    with pytest.raises(ValueError, match="num_groups"):
        grouped_rollout_seed(0, 1, 0)
    # The largest session still fits: 1024 groups of one.
    assert grouped_rollout_seed(7, 10**9, 1024) + 1024 * ROLLOUT_EPISODES <= TRAIN_SEEDS.stop
