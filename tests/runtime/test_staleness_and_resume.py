from __future__ import annotations

import asyncio
from pathlib import Path

from joynexus.control.job import JobState
from joynexus.runtime import EmbeddedRuntime
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
    rt = EmbeddedRuntime(tmp_path / "run")
    summary = asyncio.run(rt.run([s]))
    assert rt.scheduler is not None
    dropped = rt.scheduler.list_jobs(tenant_id="stale", state=JobState.DROPPED)
    assert dropped, "a job rolled out at an older version must be dropped"
    for job in dropped:
        assert job.terminal_reason == REASON_POLICY_STALE
        assert job.max_policy_staleness == 0
        assert job.timestamps.leased_at is not None  # dropped by the actor after lease_next
    assert summary.tenants["stale"].jobs_dropped == len(dropped)
    assert summary.tenants["stale"].jobs_completed >= 2
    assert rt.queue.partitions() == []


def test_resume_from_checkpoint_continues_the_version(tmp_path: Path, tiny_model: str) -> None:
    out, run = tmp_path / "out", tmp_path / "run"
    rt1 = EmbeddedRuntime(run)
    first = asyncio.run(rt1.run([rl_spec("res", tiny_model, out, target=2, horizon=6)]))
    assert rt1.scheduler is not None
    old_ids = {j.job_id for j in rt1.scheduler.list_jobs(tenant_id="res")}
    v1 = first.tenants["res"].final_version
    assert v1 is not None and v1 >= 2
    assert (out / "res" / f"step_{v1}" / "manifest.json").is_file()

    # Same run dir (the scheduler remembers the completed jobs), higher target.
    rt = EmbeddedRuntime(run)
    second = asyncio.run(rt.run([rl_spec("res", tiny_model, out, target=4, horizon=6)]))
    s = second.tenants["res"]
    assert s.resumed_from_version == v1
    assert s.final_version is not None and s.final_version > v1
    assert s.jobs_completed >= 4
    # The new run's first job was rolled out with the resumed version, not from scratch.
    assert rt.scheduler is not None
    new = [j for j in rt.scheduler.list_jobs(tenant_id="res") if j.job_id not in old_ids]
    assert new and min(j.behavior_policy_version or 0 for j in new) >= v1
