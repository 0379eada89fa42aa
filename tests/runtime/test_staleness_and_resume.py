from __future__ import annotations

import asyncio
from pathlib import Path

from joynexus.control.job import JobState
from joynexus.master.run import LocalRun, run_workloads
from joynexus.workflows.actor import REASON_POLICY_STALE
from tests.workflows.helpers import rl_spec


def test_staleness_bound_zero_drops_jobs_rolled_out_while_training(
    tmp_path: Path, tiny_model: str
) -> None:
    # Two RL jobs in flight: the second is reserved (at the then-current version) right
    # after the first is produced, so when it becomes ready the actor has trained the
    # first one and v_actor - v_behavior >= 1 > 0 = the bound: Eq. (1) drops it.
    s = rl_spec(
        "stale", tiny_model, tmp_path / "out", target=2, horizon=6, staleness=0, max_in_flight=2
    )
    opened: list[LocalRun] = []
    summary = asyncio.run(run_workloads([s], tmp_path / "run", on_open=opened.append))
    (run,) = opened
    assert run.plane is not None
    # The scheduler is closed with the run but its job index stays queryable.
    dropped = run.plane.scheduler.list_jobs(tenant_id="stale", state=JobState.DROPPED)
    assert dropped, "a job rolled out at an older version must be dropped"
    for job in dropped:
        assert job.terminal_reason == REASON_POLICY_STALE
        assert job.max_policy_staleness == 0
        assert job.timestamps.leased_at is not None  # dropped by the actor after lease_next
    assert summary.tenants["stale"].state == "completed"
    assert summary.tenants["stale"].jobs_dropped == len(dropped)
    assert summary.tenants["stale"].jobs_completed >= 2
    assert run.plane.queue.partitions() == []


def test_resume_from_checkpoint_continues_the_version(tmp_path: Path, tiny_model: str) -> None:
    # Semantic change: checkpoints live in <run_dir>/outputs/<tenant> (the spec's
    # output_dir is ignored), and a run directory remembers its workloads: the same
    # spec again *is* the same (finished) workload, while a spec with a larger
    # completion_target is a new workload that resumes from the tenant's latest
    # checkpoint and runs ``completion_target`` jobs of its own (the target counts the
    # new workload's jobs, not the tenant's total).
    out, run_dir = tmp_path / "out", tmp_path / "run"
    ckpts = run_dir / "outputs" / "res"
    spec2 = rl_spec("res", tiny_model, out, target=2, horizon=6)
    opened: list[LocalRun] = []
    first = asyncio.run(run_workloads([spec2], run_dir, on_open=opened.append))
    run1 = opened.pop()
    assert run1.plane is not None
    old_ids = {j.job_id for j in run1.plane.scheduler.list_jobs(tenant_id="res")}
    wid1 = run1.workload_ids["res"]
    f = first.tenants["res"]
    v1 = f.final_version
    assert f.state == "completed" and f.jobs_completed >= 2
    assert v1 is not None and v1 >= 2
    assert (ckpts / f"step_{v1}" / "manifest.json").is_file()
    assert f.output_dir == str(ckpts)

    # The identical spec on the same run dir: the same workload, reported as it ended
    # (no new job, no new version).
    again = asyncio.run(run_workloads([spec2], run_dir, on_open=opened.append))
    run_again = opened.pop()
    assert run_again.workload_ids["res"] == wid1
    a = again.tenants["res"]
    assert a.state == "completed" and a.final_version == v1
    assert a.jobs_completed == f.jobs_completed
    assert run_again.plane is not None
    assert {j.job_id for j in run_again.plane.scheduler.list_jobs(tenant_id="res")} == old_ids

    # Same run dir (the scheduler remembers the completed jobs), higher target: a new
    # workload resumed from the latest checkpoint.
    second = asyncio.run(
        run_workloads(
            [rl_spec("res", tiny_model, out, target=4, horizon=6)], run_dir, on_open=opened.append
        )
    )
    run2 = opened.pop()
    assert run2.workload_ids["res"] != wid1
    s = second.tenants["res"]
    assert s.state == "completed"
    assert s.resumed_from_version == v1
    assert s.final_version is not None and s.final_version > v1
    assert s.jobs_completed >= 4
    # The new run's first job was rolled out with the resumed version, not from scratch.
    assert run2.plane is not None
    new = [j for j in run2.plane.scheduler.list_jobs(tenant_id="res") if j.job_id not in old_ids]
    assert new and min(j.behavior_policy_version or 0 for j in new) >= v1
    assert all(j.metadata.get("workload_id") == run2.workload_ids["res"] for j in new)

    # fresh=True wipes the run state: the same spec starts over from version 0.
    third = asyncio.run(run_workloads([spec2], run_dir, fresh=True, on_open=opened.append))
    run3 = opened.pop()
    t = third.tenants["res"]
    assert t.state == "completed" and t.resumed_from_version is None
    assert t.final_version is not None and t.final_version < s.final_version
    assert run3.plane is not None
    assert not {j.job_id for j in run3.plane.scheduler.list_jobs(tenant_id="res")} & old_ids
