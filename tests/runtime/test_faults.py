"""Fault tests: an environment worker SIGKILLed during a mixed workload (in-process Master).

Two reach2d RL tenants and one SFT tenant share one in-process Master
(:func:`~joynexus.master.run.run_workloads`, in-process placement; the health wiring is
the same for every placement). Once the victim RL tenant has completed a job (a known
point, observed through ``on_progress``), its simulator worker process is SIGKILLed. The
Health Manager's ``environment`` role must recreate the session, the rollout that hit
the dead worker fails and its producer reserves a new job, and every tenant still
reaches its completion target while the other tenants see no failure at all.

With no recovery budget left for the victim the same kill ends the victim's workload
``failed`` (its budget is its own): the bystander completes, nothing escalates.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from joynexus.api import WorkloadState
from joynexus.control.job import JobState
from joynexus.master.run import LocalRun, run_workloads
from joynexus.services.environment import EnvironmentService
from joynexus.workflows.summary import TenantProgress
from tests.workflows.helpers import rl_spec, spec

BASE = "tiny:qwen2_5_vl"
TARGET = 4  # > max_in_flight + 1: at least one rollout starts after the kill


def _kill_on_next_step(run: LocalRun, tenant_id: str, killed: list[dict[str, Any]]) -> None:
    """SIGKILL ``tenant_id``'s simulator worker right before its next ``step`` reaches it.

    The kill happens inside a rollout, so exactly that rollout sees the dead worker
    (no race with a rollout that might finish first or not have started yet).
    """
    assert run.plane is not None
    env = run.plane.env
    assert isinstance(env, EnvironmentService)  # in process: its workers are reachable
    step = env.step

    async def killing_step(session_id: str, actions: Any, *, tenant_id: str) -> Any:
        if not killed and tenant_id == victim:
            worker = env._sessions[session_id].worker  # internals: the real process
            pid = worker.process.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)  # no await until the step holds the session
            killed.append({"pid": pid, "session": session_id})
        return await step(session_id, actions, tenant_id=tenant_id)

    victim = tenant_id
    env.step = killing_step  # type: ignore[method-assign]  # the fault-injection hook


def test_env_worker_killed_during_mixed_workload(tmp_path: Path, reach2d_demos: Path) -> None:
    out = tmp_path / "out"
    rl = {"target": TARGET, "horizon": 8, "num_envs": 2, "episode_steps": 8}
    specs = [
        rl_spec("victim", BASE, out, **rl),
        rl_spec("bystander", BASE, out, seed=1, **rl),
        spec(
            {
                "tenant": "sft",
                "task": "sft",
                "base_model": {"id": BASE},
                "dataset": {"path": str(reach2d_demos), "heldout_fraction": 0.2},
                "action_module": {"type": "oft", "hidden_dim": 64, "num_blocks": 1},
                "algorithm": {"name": "sft", "samples_per_job": 16, "microbatch_size": 16},
                "scheduling": {"completion_target": 3, "prefetch": 2},
                "output_dir": str(out),
            }
        ),
    ]
    opened: list[LocalRun] = []
    killed: list[dict[str, Any]] = []
    armed: list[bool] = []

    def on_progress(rows: list[TenantProgress]) -> None:
        victim = next(r for r in rows if r.tenant == "victim")
        if not armed and victim.completed >= 1:  # a known point: after the first job
            armed.append(True)
            _kill_on_next_step(opened[0], "victim", killed)

    summary = asyncio.run(
        run_workloads(
            specs,
            tmp_path / "run",
            health_check_s=0.05,
            on_progress=on_progress,
            on_open=opened.append,
        )
    )
    (run,) = opened
    assert run.plane is not None and run.master is not None
    tenants = {t: run.master.reporter.tenant_of(wid) for t, wid in run.workload_ids.items()}

    assert killed, "the workload finished before the kill"
    env = run.plane.env
    assert isinstance(env, EnvironmentService) and env.on_crash is not None  # hook wired
    # The environment role was restarted in place, nothing escalated.
    kinds = [e.kind for e in run.health.events_of("environment")]
    assert "restart_started" in kinds and "restarted" in kinds, kinds
    assert "restart_failed" not in kinds and run.health.escalated is None
    victim = tenants["victim"]
    assert victim is not None and victim.session_id != killed[0]["session"]
    restarts = victim.metrics.of_kind("session_restarted")
    assert [r["old"] for r in restarts] == [killed[0]["session"]]
    # The other tenants' sessions were never touched.
    for t in ("bystander", "sft"):
        other = tenants[t]
        assert other is not None and not other.metrics.of_kind("session_restarted")
    assert {t.state for t in summary.tenants.values()} == {"completed"}

    sched = run.plane.scheduler  # closed with the run; its job index stays queryable
    s = summary.tenants
    for tid, target in (("victim", TARGET), ("bystander", TARGET), ("sft", 3)):
        jobs = sched.list_jobs(tenant_id=tid)
        assert all(j.is_terminal for j in jobs), tid
        assert s[tid].jobs_completed >= target, (tid, s[tid])
    # The rollout that hit the dead worker failed and its producer reserved another one.
    victim_jobs = sched.list_jobs(tenant_id="victim")
    failed = [j for j in victim_jobs if j.state is JobState.FAILED]
    # Exactly one: while the session is recreated the producer reserves nothing.
    assert len(failed) == 1, [(j.job_id, j.terminal_reason) for j in failed]
    assert (failed[0].terminal_reason or "").startswith("simulator_crashed"), failed[0]
    assert any(
        j.state is JobState.COMPLETED and j.created_seq > failed[0].created_seq for j in victim_jobs
    ), "no job was reserved and completed after the failed rollout"
    assert s["victim"].jobs_failed == 1
    # The other tenants were untouched.
    assert s["bystander"].jobs_failed == 0 and s["sft"].jobs_failed == 0
    for tid in ("bystander", "sft"):
        assert all(j.state is JobState.COMPLETED for j in sched.list_jobs(tenant_id=tid))
    # No partition leaked.
    assert run.plane.queue.partitions() == [] and run.plane.queue.nbytes == 0
    assert s["victim"].final_version == s["victim"].jobs_completed


def test_env_worker_killed_past_its_tenants_budget_fails_that_tenant_only(
    tmp_path: Path,
) -> None:
    # The recovery budget is per tenant (issue 28, item 6): with a budget of 0 the
    # first crash of the victim's simulator ends the victim's workload, with a reason
    # naming only its own session; the bystander's workload is never touched and
    # nothing escalates to a global restart.
    out = tmp_path / "out"
    rl = {"horizon": 8, "num_envs": 2, "episode_steps": 8}
    specs = [
        rl_spec("victim", BASE, out, target=40, **rl),  # far from its target at the kill
        rl_spec("bystander", BASE, out, seed=1, target=TARGET, **rl),
    ]
    opened: list[LocalRun] = []
    killed: list[dict[str, Any]] = []
    armed: list[bool] = []

    def on_progress(rows: list[TenantProgress]) -> None:
        victim = next(r for r in rows if r.tenant == "victim")
        if not armed and victim.completed >= 1:
            armed.append(True)
            _kill_on_next_step(opened[0], "victim", killed)

    summary = asyncio.run(
        run_workloads(
            specs,
            tmp_path / "run",
            health_check_s=0.05,
            recovery_budget=0,
            on_progress=on_progress,
            on_open=opened.append,
        )
    )
    assert killed, "the workload finished before the kill"
    (run,) = opened
    assert run.master is not None and run.plane is not None
    assert run.health.escalated is None
    kinds = [e.kind for e in run.health.events_of("environment")]
    assert "budget_exhausted" in kinds and "global_restart" not in kinds, kinds
    st = run.master.reporter.status("victim", run.workload_ids["victim"])
    assert st.state is WorkloadState.FAILED, st
    assert st.error is not None and "recovery budget spent" in st.error, st.error
    assert killed[0]["session"] in st.error
    assert "bystander" not in st.error and run.workload_ids["bystander"] not in st.error
    assert summary.tenants["victim"].jobs_completed < 40
    by = run.master.reporter.status("bystander", run.workload_ids["bystander"])
    assert by.state is WorkloadState.COMPLETED and by.error is None, by
    assert summary.tenants["bystander"].jobs_completed == TARGET
    for tid in ("victim", "bystander"):  # nothing is left in flight
        assert all(j.is_terminal for j in run.plane.scheduler.list_jobs(tenant_id=tid))
    assert run.plane.queue.partitions() == [] and run.plane.queue.nbytes == 0
