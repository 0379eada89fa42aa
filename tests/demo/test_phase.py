"""One demo phase on an in-process Master: fresh state, SFT admission closed by the demo."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from joynexus.control.job import JobState
from joynexus.demo.mixture import build_mixture
from joynexus.demo.phase import PhaseTrace, run_phase, shortfall
from joynexus.errors import EnvironmentServiceError, InternalError
from joynexus.master.service import CANCELLED_REASON, RESTARTED_REASON, ROLE_RESTARTED_REASON
from joynexus.runtime.hosting import RuntimeConfig
from joynexus.services.environment import EnvironmentServiceConfig
from joynexus.spec.workload import WorkloadSpec
from joynexus.workflows.summary import RunSummary, TenantSummary

NOT_FAULT = (CANCELLED_REASON, RESTARTED_REASON, ROLE_RESTARTED_REASON)


def _specs(tmp_path: Path) -> tuple[WorkloadSpec, WorkloadSpec]:
    m = build_mixture(
        tmp_path / "outputs",
        minutes=1,
        profile="test",
        data_dir=tmp_path / "data",
        success_episodes=0,  # what a phase does, not success rates (test_success_report)
    )
    rl, sft = m.specs[0], m.specs[3]
    rl = rl.model_copy(
        update={"scheduling": rl.scheduling.model_copy(update={"completion_target": 1})}
    )
    return rl, sft  # the SFT tenant keeps its cap of SFT_MAX_JOBS jobs


def test_phase_closes_fill_admission_and_reruns_fresh(tmp_path: Path) -> None:
    rl, sft = _specs(tmp_path)
    run_dir = tmp_path / "phase"
    (run_dir / "models").mkdir(parents=True)

    def phase() -> PhaseTrace:
        return asyncio.run(run_phase("multi-tenant", [rl, sft], run_dir, fill_tenants=[sft.tenant]))

    first = phase()
    # The SFT tenant would run thousands of jobs; the phase ended because the demo
    # closed its admission (completion target 0) once the RL tenant was done.
    sft_jobs = [j for j in first.jobs if j.tenant_id == sft.tenant]
    assert 0 < len(sft_jobs) < 1000
    assert first.summary.tenants[sft.tenant].jobs_completed == len(first.completed(sft.tenant))
    assert first.matched[rl.tenant] == first.summary.tenants[rl.tenant].jobs_completed >= 1
    assert first.matched[sft.tenant] == first.updates_in_window(sft.tenant)
    assert first.started_at < first.ended_at
    assert first.busy and first.busy_seconds("training") > 0
    assert first.usage.tenants[rl.tenant].env_steps > 0
    assert any(r["kind"] == "train" for r in first.records[rl.tenant])

    # A rerun in the same directory starts over: no resumed checkpoint, no job and no
    # usage of the first run.
    second = phase()
    assert second.summary.tenants[rl.tenant].resumed_from_version is None
    last_first = max(j.finished_at or 0.0 for j in first.jobs)
    assert all(j.finished_at is None or j.finished_at > last_first for j in second.jobs)
    for t in (rl.tenant, sft.tenant):
        s = second.summary.tenants[t]
        jobs = [j for j in second.jobs if j.tenant_id == t]
        # Jobs the service ended (cancelled, restarted) are not the workload's failures.
        ended = [j for j in jobs if j.state is JobState.FAILED and j.terminal_reason in NOT_FAULT]
        assert len(jobs) == s.jobs_completed + s.jobs_dropped + s.jobs_failed + len(ended)
    assert second.usage.started_at >= first.usage.generated_at  # usage.json not resumed


def test_a_phase_whose_simulators_do_not_start_says_which_and_what_to_try(
    tmp_path: Path,
) -> None:
    """Regression: on a heavily loaded machine the paper's simulators did not start in
    the time allowed, and ``joynexus demo`` ended in a traceback saying "completed
    updates {...} fall short of {'rl-libero': 0, ...}"."""
    rl, _ = _specs(tmp_path)
    run_dir = tmp_path / "phase"
    (run_dir / "models").mkdir(parents=True)
    config = RuntimeConfig(env=EnvironmentServiceConfig(start_timeout_s=0.001))
    with pytest.raises(EnvironmentServiceError) as info:
        asyncio.run(run_phase("multi-tenant", [rl], run_dir, config=config))
    message = str(info.value)
    assert message.startswith("phase multi-tenant ended without its matched work")
    assert f"{rl.tenant} failed: " in message and "did not answer start" in message
    assert "--envs fast" in message


def test_a_shortfall_without_a_failure_names_the_tenants_that_fell_short(tmp_path: Path) -> None:
    summary = RunSummary(
        run_dir=str(tmp_path),
        wall_s=1.0,
        tenants={"rl-a": TenantSummary(task="rl", state="completed", jobs_completed=1)},
    )
    error = shortfall("isolated:rl-a", summary, {"rl-a": 2})
    assert isinstance(error, InternalError)
    assert str(error) == (
        "phase isolated:rl-a ended without its matched work, nothing to compare: "
        "rl-a completed 1 of 2 updates"
    )
