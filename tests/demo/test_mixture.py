"""The demo mixture keeps the §5.1 knobs and scales with the budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from joynexus.demo.baseline import isolated_specs
from joynexus.demo.mixture import PAPER_MIN_MINUTES, build_mixture, choose_profile
from joynexus.errors import SpecError
from joynexus.spec.workload import TaskKind
from joynexus.workflows.compile import compile_workloads


def test_profile_follows_the_budget() -> None:
    assert choose_profile(PAPER_MIN_MINUTES)[0] == "paper"
    profile, reason = choose_profile(PAPER_MIN_MINUTES - 1)
    assert profile == "fast"
    assert "LIBERO" in reason


def test_paper_profile_uses_the_papers_simulators(tmp_path: Path) -> None:
    m = build_mixture(tmp_path, minutes=10)
    kinds = [s.env.kind for s in m.specs[:3] if s.env is not None]
    assert kinds == ["libero", "maniskill", "maniskill"]
    assert [s.task for s in m.specs] == [TaskKind.RL] * 3 + [TaskKind.SFT, TaskKind.EVAL]


def test_knobs_of_section_5_1(tmp_path: Path) -> None:
    m = build_mixture(tmp_path, minutes=2, profile="test")
    rl = [s for s in m.specs if s.task is TaskKind.RL]
    (sft,) = [s for s in m.specs if s.task is TaskKind.SFT]
    (ev,) = [s for s in m.specs if s.task is TaskKind.EVAL]
    assert all(s.scheduling.max_in_flight == 2 for s in rl)
    assert all(s.scheduling.priority > sft.scheduling.priority for s in rl)
    assert all(s.scheduling.max_policy_staleness is not None for s in rl)
    assert sft.scheduling.prefetch == 16
    assert ev.evaluation is not None and ev.evaluation.targets == [m.sft_tenant]
    compiled = compile_workloads(m.specs)
    (limit,) = compiled.global_limits
    assert (limit.max_active, limit.max_active_per_tenant) == (3, 1)
    # SFT prefetch is bounded through admission.
    sft_policy = compiled.by_tenant()[m.sft_tenant].admission
    assert sft_policy is not None and sft_policy.max_in_flight == 16


def test_targets_scale_with_minutes(tmp_path: Path) -> None:
    small = build_mixture(tmp_path, minutes=2, profile="fast")
    big = build_mixture(tmp_path, minutes=20, profile="fast")
    assert big.specs[0].scheduling.completion_target > small.specs[0].scheduling.completion_target  # type: ignore[operator]


def test_bad_budget_and_profile_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="minutes"):
        build_mixture(tmp_path, minutes=0)
    with pytest.raises(SpecError, match="profile"):
        build_mixture(tmp_path, profile="nope")  # type: ignore[arg-type]


def test_isolated_specs_replay_exactly_the_matched_counts(tmp_path: Path) -> None:
    m = build_mixture(tmp_path / "mt", minutes=2, profile="test")
    matched = {"rl-reach0": 5, "rl-reach1": 0, "rl-reach2": 3, "sft-demos": 7}
    specs = isolated_specs(m.training_specs, matched, tmp_path / "iso")
    assert {s.tenant: s.scheduling.completion_target for s in specs} == {
        "rl-reach0": 5,
        "rl-reach2": 3,
        "sft-demos": 7,
    }
    assert all(s.output_dir == tmp_path / "iso" for s in specs)
    # Everything else about the workload is unchanged.
    assert specs[0].scheduling.max_in_flight == m.specs[0].scheduling.max_in_flight
    assert specs[0].algorithm == m.specs[0].algorithm
