"""Fault tests: an environment worker SIGKILLed during a mixed workload (embedded runtime).

Two reach2d RL tenants and one SFT tenant share the embedded runtime (in-process
placement; the health wiring is the same for every placement). Once the
victim RL tenant has completed a job (a known point, observed through ``on_progress``),
its simulator worker process is SIGKILLed. The Health Manager's ``environment`` role
must recreate the session, the rollout that hit the dead worker fails and its producer
reserves a new job, and every tenant still reaches its completion target while the
other tenants see no failure at all.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from joynexus.runtime.embedded import EmbeddedRuntime

from joynexus.control.job import JobState
from joynexus.workflows.summary import TenantProgress
from tests.workflows.helpers import rl_spec, spec

BASE = "tiny:qwen2_5_vl"
TARGET = 4  # > max_in_flight + 1: at least one rollout starts after the kill


def _kill_on_next_step(rt: EmbeddedRuntime, tenant_id: str, killed: list[dict[str, Any]]) -> None:
    """SIGKILL ``tenant_id``'s simulator worker right before its next ``step`` reaches it.

    The kill happens inside a rollout, so exactly that rollout sees the dead worker
    (no race with a rollout that might finish first or not have started yet).
    """
    env = rt.env
    assert env is not None
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
    rt = EmbeddedRuntime(tmp_path / "run", health_check_s=0.05)
    killed: list[dict[str, Any]] = []
    armed: list[bool] = []

    def on_progress(rows: list[TenantProgress]) -> None:
        victim = next(r for r in rows if r.tenant == "victim")
        if not armed and victim.completed >= 1:  # a known point: after the first job
            armed.append(True)
            _kill_on_next_step(rt, "victim", killed)

    summary = asyncio.run(rt.run(specs, on_progress=on_progress))

    assert killed, "the workload finished before the kill"
    assert rt.env is not None and rt.env.on_crash is not None  # the crash hook is wired
    # The environment role was restarted in place, nothing escalated.
    kinds = [e.kind for e in rt.health.events_of("environment")]
    assert "restart_started" in kinds and "restarted" in kinds, kinds
    assert "restart_failed" not in kinds and rt.health.escalated is None
    assert rt.tenants["victim"].session_id != killed[0]["session"]
    restarts = rt.tenants["victim"].metrics.of_kind("session_restarted")
    assert [r["old"] for r in restarts] == [killed[0]["session"]]
    # The other tenants' sessions were never touched.
    assert all(not rt.tenants[t].metrics.of_kind("session_restarted") for t in ("bystander", "sft"))

    sched = rt.scheduler
    assert sched is not None
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
    assert rt.queue.partitions() == [] and rt.queue.nbytes == 0
    assert s["victim"].final_version == s["victim"].jobs_completed
