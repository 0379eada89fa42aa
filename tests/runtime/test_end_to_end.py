"""End-to-end: 2 RL tenants (PushT, reach2d) + 1 SFT tenant + 1 evaluation, concurrently."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from joynexus.control.job import JobState, TaskType
from joynexus.master.run import LocalRun, run_workloads
from tests.workflows.helpers import rl_spec, spec


def test_mixed_workloads_run_to_completion(
    tmp_path: Path, tiny_model: str, reach2d_demos: Path
) -> None:
    out = tmp_path / "out"
    specs = [
        rl_spec("pusht-rl", tiny_model, out, kind="pusht", target=2, horizon=8, num_envs=2),
        rl_spec("reach-rl", tiny_model, out, target=3, horizon=12, num_envs=2, episode_steps=6),
        spec(
            {
                "tenant": "reach-sft",
                "task": "sft",
                "base_model": {"id": tiny_model},
                "dataset": {"path": str(reach2d_demos), "heldout_fraction": 0.2},
                "action_module": {"type": "oft", "hidden_dim": 64, "num_blocks": 1},
                "algorithm": {"name": "sft", "samples_per_job": 32, "microbatch_size": 16},
                "scheduling": {"completion_target": 3, "prefetch": 2},
                "output_dir": str(out),
            }
        ),
        spec(
            {
                "tenant": "reach-eval",
                "task": "eval",
                "base_model": {"id": tiny_model},
                "env": {"kind": "reach2d", "image_size": 32, "max_episode_steps": 10},
                "evaluation": {
                    "targets": ["reach-rl"],
                    "episodes": 2,
                    "interval_s": 0.3,
                    "runs": 2,
                },
                "output_dir": str(out),
            }
        ),
    ]
    opened: list[LocalRun] = []
    run_dir = tmp_path / "run"
    summary = asyncio.run(run_workloads(specs, run_dir, on_open=opened.append))
    s = summary.tenants
    (local,) = opened
    assert local.plane is not None and local.master is not None
    sched = local.plane.scheduler  # closed with the run; its job index stays queryable
    assert {t.state for t in s.values()} == {"completed"}, {t: x.errors for t, x in s.items()}

    # Every training job ended completed, and passed through every state on the way.
    for tenant, target in (("pusht-rl", 2), ("reach-rl", 3), ("reach-sft", 3)):
        jobs = sched.list_jobs(tenant_id=tenant)
        assert all(j.is_terminal for j in jobs)
        done = [j for j in jobs if j.state is JobState.COMPLETED]
        assert len(done) == s[tenant].jobs_completed >= target
        for j in done:
            ts = j.timestamps
            assert ts.ready_at is not None and ts.leased_at is not None
            assert ts.created_at <= ts.ready_at <= ts.leased_at <= (ts.finished_at or 0)
            assert j.metadata["schema_signature"]
            if j.task_type is TaskType.RL:
                assert j.behavior_policy_version is not None
                assert j.metadata["actor_versions"][tenant] > j.behavior_policy_version
    counters = sched.counters()
    assert counters["by_state"].get("failed", 0) == 0
    assert sum(counters["by_state"].values()) == counters["total"]

    # Every partition was cleared.
    assert local.plane.queue.partitions() == []
    assert local.plane.queue.nbytes == 0

    # Versions advanced per tenant, independently: one version per own microbatch
    # (RL: one microbatch per job here; SFT: 32 samples / 16 per microbatch).
    assert s["pusht-rl"].final_version == s["pusht-rl"].jobs_completed
    assert s["reach-rl"].final_version == s["reach-rl"].jobs_completed
    assert s["reach-sft"].final_version == 2 * s["reach-sft"].jobs_completed

    # Each evaluation run saw exactly one version; evaluation trained nothing.
    runs = s["reach-eval"].eval_runs
    assert len(runs) == 2
    for run in runs:
        assert run.versions_seen == [run.version]
    assert runs[0].version <= runs[1].version <= s["reach-rl"].final_version
    assert s["reach-eval"].jobs_completed == 0 and s["reach-eval"].final_version is None
    assert sched.list_jobs(tenant_id="reach-eval") == []
    assert s["reach-eval"].eval_success_rate is not None

    # Summary fields and artifacts.
    assert s["reach-sft"].sft_heldout_error_initial is not None
    assert s["reach-sft"].sft_heldout_error_final is not None
    assert s["reach-rl"].rl_return_initial is not None
    doc = summary.to_json()
    assert {"task", "jobs_completed", "jobs_dropped", "jobs_failed", "final_version"} <= set(
        doc["pusht-rl"]
    )
    # Semantic change: a tenant's outputs live in <run_dir>/outputs/<tenant> (the specs'
    # output_dir is ignored) and each workload's records in
    # <tenant dir>/workloads/<workload id>/metrics.jsonl.
    for tenant in ("pusht-rl", "reach-rl", "reach-sft", "reach-eval"):
        assert s[tenant].output_dir == str(run_dir / "outputs" / tenant)
    assert not out.exists()
    for tenant in ("pusht-rl", "reach-rl", "reach-sft"):
        tdir = run_dir / "outputs" / tenant
        assert any(tdir.glob("step_*/manifest.json"))
        wid = local.workload_ids[tenant]
        lines = (tdir / "workloads" / wid / "metrics.jsonl").read_text().splitlines()
        kinds = {json.loads(line)["kind"] for line in lines}
        assert "train" in kinds
    wid = local.workload_ids["reach-eval"]
    assert (run_dir / "outputs" / "reach-eval" / "workloads" / wid / "metrics.jsonl").is_file()


def test_a_local_run_takes_the_sub_envs_its_file_declares(tmp_path: Path, tiny_model: str) -> None:
    """``joynexus run`` is single-user: more sub-envs than a hosted server's cap run."""
    from joynexus.master.limits import MasterLimits

    wide = MasterLimits().max_num_envs + 4
    specs = [rl_spec("wide", tiny_model, tmp_path / "out", target=1, horizon=2, num_envs=wide)]
    opened: list[LocalRun] = []
    summary = asyncio.run(run_workloads(specs, tmp_path / "run", on_open=opened.append))
    assert summary.tenants["wide"].state == "completed", summary.tenants["wide"].errors
    (local,) = opened
    assert local.master is not None and local.master.limits.max_num_envs == wide
