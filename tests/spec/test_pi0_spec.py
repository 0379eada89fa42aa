"""Workload specs naming a π0 action expert."""

from __future__ import annotations

from typing import Any

import pytest

from joynexus.errors import SpecError
from joynexus.models.policies import Pi0ExpertConfig
from joynexus.spec.workload import parse_spec


def _spec(task: str, **extra: Any) -> dict[str, Any]:
    return {
        "tenant": "a",
        "task": task,
        "base_model": {"id": "tiny:pi0"},
        "env": {"kind": "reach2d"},
        "action_module": {"type": "pi0_expert", "num_inference_steps": 4},
        **extra,
    }


def test_pi0_expert_parses_with_its_settings() -> None:
    spec = parse_spec(_spec("sft", dataset={"path": "demos"}))
    assert spec.action_module == Pi0ExpertConfig(num_inference_steps=4)
    assert spec.action_module.init == "pretrained"


def test_unknown_expert_settings_are_refused() -> None:
    bad = _spec("sft", dataset={"path": "demos"})
    bad["action_module"]["num_inference_steps"] = 0
    with pytest.raises(SpecError, match="num_inference_steps"):
        parse_spec(bad)


def test_rl_on_a_pi0_expert_follows_the_flow_sde_rules() -> None:
    spec = parse_spec(_spec("rl", algorithm={"name": "grpo"}))
    assert isinstance(spec.action_module, Pi0ExpertConfig)
    with pytest.raises(SpecError, match="entropy_coef must be 0 with a 'pi0_expert'"):
        parse_spec(_spec("rl", algorithm={"name": "grpo", "entropy_coef": 0.01}))
    too_many = _spec("rl", algorithm={"name": "grpo"})
    too_many["action_module"]["num_inference_steps"] = 65
    with pytest.raises(SpecError, match="num_inference_steps"):
        parse_spec(too_many)
