"""Scheduler invariants over simulated runs (the scheduler is the real one)."""

from __future__ import annotations

from dataclasses import asdict

from joynexus.control.job import JobState
from joynexus.sim.model import RunResult, Simulation
from joynexus.sim.scenario import Scenario, expand
from tests.sim.conftest import small


def _multi(sc: Scenario) -> RunResult:
    return Simulation(sc, expand(sc), window_s=sc.window_s).run()


def test_every_job_is_terminal_or_accounted_for(small_scenario: Scenario) -> None:
    res = _multi(small_scenario)
    assert res.violations == []
    assert res.updates, "the run trained nothing"
    by_state: dict[JobState, int] = {}
    for job in res.jobs:
        by_state[job.state] = by_state.get(job.state, 0) + 1
    # Actors finished their last lease before the run ended; nothing failed.
    assert by_state.get(JobState.LEASED, 0) == 0
    assert by_state.get(JobState.FAILED, 0) == 0
    assert by_state.get(JobState.COMPLETED, 0) == len(res.updates)
    assert by_state.get(JobState.DROPPED, 0) == len(res.drops)
    # Whatever is left is work in the pipeline when the window closed.
    leftover = {s for s in by_state if s not in (JobState.COMPLETED, JobState.DROPPED)}
    assert leftover <= {
        JobState.RESERVED,
        JobState.NEEDS_ADVANTAGES,
        JobState.COMPUTING_ADVANTAGES,
        JobState.READY,
    }
    assert res.counters["total"] == len(res.jobs)
    # No job was leased (and so trained or dropped) twice.
    ids = [u.job_id for u in res.updates + res.drops]
    assert len(ids) == len(set(ids))
    # Per-tenant versions advance by exactly the microbatches trained.
    for tenant, version in res.final_versions.items():
        assert version == sum(u.microbatches for u in res.updates if u.tenant_id == tenant)


def test_rl_ready_jobs_are_leased_before_older_sft_jobs(small_scenario: Scenario) -> None:
    res = _multi(small_scenario)
    assert res.violations == []
    assert {u.task_type for u in res.updates} == {"rl", "sft"}


def test_the_priority_audit_can_fail_when_rl_has_no_priority() -> None:
    sc = small(scheduler={"rl_priority": 0, "sft_priority": 0})
    res = _multi(sc)
    assert any("while RL jobs" in v for v in res.violations)


def test_admission_limits_hold_and_bind() -> None:
    # Six RL tenants but at most 3 active rollouts: the global limit must bind.
    base = small()
    data = base.model_dump()
    extra = [t | {"tenant_id": t["tenant_id"] + "-b"} for t in data["rl_tenants"]]
    data["rl_tenants"] = data["rl_tenants"] + extra
    sc = Scenario.model_validate(data)
    res = _multi(sc)
    assert res.violations == []
    assert res.max_active_rollouts == 3
    assert max(res.max_active_rollouts_per_tenant.values()) == 1
    assert res.refusals["global_max_active"] > 0
    # ≤ 2 outstanding jobs per RL tenant: never more than 2 nonterminal at once.
    for tenant in res.max_active_rollouts_per_tenant:
        events: list[tuple[float, int]] = []
        for job in res.jobs:
            if job.tenant_id == tenant:
                events.append((job.created_at, 1))
                if job.finished_at is not None:
                    events.append((job.finished_at, -1))
        live = peak = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
            live += delta
            peak = max(peak, live)
        assert peak <= 2


def test_staleness_bound_zero_drops_rl_jobs() -> None:
    res = _multi(small(scheduler={"staleness_bound": 0}))
    assert res.drops
    assert all(d.task_type == "rl" for d in res.drops)
    for d in res.drops:
        assert d.behavior_version is not None and d.actor_version > d.behavior_version
    dropped = [j for j in res.jobs if j.state is JobState.DROPPED]
    assert {j.terminal_reason for j in dropped} == {"policy_stale"}


def test_default_bound_drops_nothing(small_scenario: Scenario) -> None:
    assert _multi(small_scenario).drops == []


def test_a_run_is_deterministic(small_scenario: Scenario) -> None:
    def trace() -> list[dict[str, object]]:
        res = _multi(small_scenario)
        return [asdict(u) | {"job_id": None} for u in res.updates]

    first = trace()
    assert first == trace()


def test_isolated_mode_stops_at_the_completion_target(small_scenario: Scenario) -> None:
    from joynexus.sim.scenario import isolated_rl

    spec = expand(small_scenario).rl[0]
    tid = spec.tenant.tenant_id
    res = Simulation(
        small_scenario, isolated_rl(small_scenario, spec), completion_targets={tid: 4}
    ).run()
    assert len(res.updates) == 4
    assert res.end_time == res.updates[-1].finished_at
    # One actor GPU: twice the microbatches of the two-GPU layout for the same job.
    assert res.updates[0].microbatches == 2 * -(-spec.tenant.sample_count // 256)


def test_timeline_bins_busy_time() -> None:
    from joynexus.sim.model import timeline

    # Two GPUs: one busy 0-90 s, one busy 30-60 s; bins of 60 s over 120 s.
    bins = timeline([[(0.0, 90.0)], [(30.0, 60.0)]], until=120.0, bin_s=60.0)
    assert bins == [(60 + 30) / 120, 30 / 120]
    # Busy time beyond ``until`` is cut off; a short last bin uses its own width.
    assert timeline([[(0.0, 500.0)]], until=90.0, bin_s=60.0) == [1.0, 1.0]
    assert timeline([], until=10.0, bin_s=1.0) == []


def test_leases_live_on_simulated_time_and_heartbeats_keep_them() -> None:
    # TTL 12 s is shorter than a maniskill-2 rollout (~10 chunks of ~2 s) and than the
    # 600 s run: only heartbeats on the simulated clock keep the leases alive.
    base = small().model_dump()
    sft = [t | {"load_s": 4.0} for t in base["sft_tenants"]]
    sc = small(scheduler={"lease_ttl_s": 12.0}, sft_tenants=sft)
    res = _multi(sc)
    assert res.violations == []
    rollout = max(t.horizon * t.env_step_s for t in sc.rl_tenants)
    assert rollout > sc.scheduler.lease_ttl_s
    assert all(j.attempts == 0 for j in res.jobs)
    assert not [j for j in res.jobs if j.state is JobState.FAILED]


def test_a_lease_ttl_shorter_than_a_stage_is_rejected() -> None:
    import pytest

    from joynexus.errors import SpecError
    from joynexus.sim.scenario import scenario_from_dict

    data = small().model_dump(mode="json")
    data["scheduler"]["lease_ttl_s"] = 5.0  # the SFT dataloader takes 10 s per batch
    with pytest.raises(SpecError, match="lease_ttl_s"):
        scenario_from_dict(data)
