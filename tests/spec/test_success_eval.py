"""``success_eval``: where a workload's success rate is measured, on seeds of its own."""

from __future__ import annotations

from typing import Any

import pytest

from joynexus.envs.seeds import EVAL_SEED_BASE, demo_seeds, eval_seeds, shared_seeds
from joynexus.errors import SpecError
from joynexus.spec.workload import parse_spec


def _sft(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "tenant": "a",
        "task": "sft",
        "base_model": {"id": "tiny:qwen2_5_vl"},
        "env": {"kind": "metaworld", "task": "reach-v3"},
        "dataset": {"path": "demos", "record_episodes": 30},
        "success_eval": {"episodes": 50},
    }
    spec.update(extra)
    return spec


def test_default_evaluation_seeds_never_meet_default_demonstration_seeds() -> None:
    spec = parse_spec(_sft())
    assert spec.success_eval is not None
    assert spec.success_eval.seed == EVAL_SEED_BASE
    demos = demo_seeds(spec.seed, 30)
    evals = eval_seeds(spec.success_eval.seed, spec.success_eval.episodes)
    assert len(shared_seeds(demos, evals)) == 0
    assert len(evals) == 50


def test_evaluation_seeds_that_meet_the_demonstration_seeds_are_refused() -> None:
    with pytest.raises(SpecError, match=r"success_eval seeds 20\.\.69 meet"):
        parse_spec(_sft(success_eval={"episodes": 50, "seed": 20}))
    with pytest.raises(SpecError, match="meet"):  # the spec's seed moves the recording
        parse_spec(_sft(seed=EVAL_SEED_BASE + 49))
    parse_spec(_sft(success_eval={"episodes": 50, "seed": 30}))  # adjacent is fine


def test_more_episodes_before_training_than_after_are_checked_against_the_demos() -> None:
    # The before-measurement's seeds count too: 70 of them from 0 reach the demos' 0..29
    # no matter how few the after-measurement plays.
    with pytest.raises(SpecError, match=r"success_eval seeds 1\.\.70 meet"):
        parse_spec(_sft(success_eval={"episodes": 5, "initial_episodes": 70, "seed": 1}))
    parse_spec(_sft(success_eval={"episodes": 50, "initial_episodes": 10}))


def test_success_eval_needs_a_trainable_task_and_an_env() -> None:
    no_env = _sft(dataset={"path": "demos"})
    no_env.pop("env")
    with pytest.raises(SpecError, match="needs an 'env'"):
        parse_spec(no_env)
    with pytest.raises(SpecError, match="rl or sft"):
        parse_spec(
            {
                "tenant": "a",
                "task": "eval",
                "base_model": {"id": "x"},
                "env": {"kind": "reach2d"},
                "evaluation": {"targets": ["b"]},
                "success_eval": {},
            }
        )


def test_shared_seeds() -> None:
    assert shared_seeds(range(0, 10), range(5, 20)) == range(5, 10)
    assert len(shared_seeds(range(0, 10), range(10, 20))) == 0
