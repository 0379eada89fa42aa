"""Fault test: ``joynexus serve`` SIGKILLed during training, then SIGTERMed, on one run dir.

The server runs as a real subprocess (127.0.0.1, a free port, a tmp run directory, the
tiny backbone). A tenant's reach2d RL workload trains (one optimizer step per job, a
checkpoint with a job ledger before every publication). Once a job has completed and
a checkpoint exists the server is SIGKILLed; the restarted server must resume the
workload **by itself** (nobody resubmits it): ``GET /v1/workloads`` lists it again, the
jobs left in flight are settled against the latest checkpoint's ledger (the one whose
update is in the weights completes, the others fail ``runtime_restarted``), and it
trains on from the checkpoint. After one more job the server is stopped cleanly
(SIGTERM), which must behave exactly like the crash. The third server finishes the
workload: its completion target reached, versions never going back, every job
completed exactly once, and the final weights holding exactly the target's updates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np

from joynexus.client import APIError, Client, RetryPolicy
from joynexus.control.job import JobState, TrainingJob
from tests.server.livesrv import reach_rl
from tests.server.subproc import (
    BASE,
    checkpoint_versions,
    latest_ledger,
    scheduler_jobs,
    serve,
    wait_for,
)

TARGET = 8
TENANT = "alice"
#: What a reach2d policy reads (any values: only the answering version matters).
CAMERAS = {"top": np.zeros((1, 32, 32, 3), np.uint8)}
STATE = np.zeros((1, 4), np.float32)
INSTRUCTION = ["Move the red point to the green goal."]
#: The jobs a clean stop fails on its way down (the loops' own cancellation), besides
#: the ones a restart settles: none of them counts against the workload.
STOP_REASONS = ("runtime_restarted", "cancelled")


class Observer:
    """Everything the test saw of the workload through the API, in order."""

    def __init__(self, wid: str, auth: dict[str, str]) -> None:
        self.wid, self.auth = wid, auth
        #: Versions ``predict`` answered with (what is served), across every server.
        self.served: list[int] = []

    def status(self, http: httpx.Client) -> dict[str, Any]:
        r = http.get(f"/v1/workloads/{self.wid}/status", headers=self.auth)
        assert r.status_code == 200, r.text
        st: dict[str, Any] = r.json()
        assert st["state"] not in ("failed", "cancelled"), st
        self.predict(str(http.base_url))
        return st

    def predict(self, url: str) -> None:
        key = self.auth["Authorization"].removeprefix("Bearer ")
        with Client(url, key, timeout=30, retry=RetryPolicy(max_retries=0)) as c:
            try:
                p = c.predict(TENANT, CAMERAS, STATE, INSTRUCTION)
            except APIError as exc:  # no slot yet: the workload is still starting
                assert exc.status in (404, 409), exc
                return
        self.served.append(p.policy_version)

    def progressed(self, http: httpx.Client, at_least: int) -> dict[str, Any] | None:
        st = self.status(http)
        return st if st["jobs_completed"] >= at_least else None


def _jobs_of(jobs: list[TrainingJob], wid: str) -> list[TrainingJob]:
    return [j for j in jobs if j.metadata.get("workload_id") == wid]


def _listed_again(obs: Observer, http: httpx.Client, restarts: int) -> None:
    """After a restart the workload is back by itself: listed, live, counted restarted."""
    r = http.get("/v1/workloads", headers=obs.auth)
    assert r.status_code == 200, r.text
    listed = {w["workload_id"]: w for w in r.json()}
    assert set(listed) == {obs.wid}, listed  # resumed, not resubmitted: one workload
    st = listed[obs.wid]
    assert st["state"] in ("starting", "running"), st
    assert st["restarts"] == restarts, st
    assert st["error"] is None and st["stalled"] is None, st


def _check_reconciled(
    at_stop: list[TrainingJob], ledger: dict[str, Any], http: httpx.Client, auth: dict[str, str]
) -> list[str]:
    """The jobs left in flight at a stop, as the restarted server settled them: the one
    the latest checkpoint's ledger names completed, every other failed ``runtime_restarted``.
    Returns the ids of the jobs in flight at the stop."""
    r = http.get("/v1/scheduler/jobs", headers=auth)
    assert r.status_code == 200, r.text
    now = {j["job_id"]: j for j in r.json()}
    assert {j.job_id for j in at_stop} <= set(now)  # nothing lost
    in_flight = [j.job_id for j in at_stop if not j.is_terminal]
    for j in at_stop:
        if j.is_terminal:  # terminal before the stop: unchanged
            assert now[j.job_id]["state"] == j.state.value, (j, now[j.job_id])
        elif j.job_id == ledger.get("job_id"):
            assert now[j.job_id]["state"] == "completed", now[j.job_id]
        else:
            assert now[j.job_id]["state"] == "failed", now[j.job_id]
            assert now[j.job_id]["terminal_reason"] == "runtime_restarted", now[j.job_id]
    return in_flight


def test_server_killed_then_stopped_resumes_workload_by_itself(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "serve.log"
    # horizon 8 x 2 envs = one microbatch of 16: one optimizer step (one version) per job.
    spec: dict[str, Any] = reach_rl(TENANT, BASE, target=TARGET)
    resumed_from: list[int] = []

    # --- first server: train until a job completed and a checkpoint exists, then SIGKILL.
    with serve(run_dir, log) as srv:
        auth = srv.create_tenant(TENANT)
        with srv.client() as http:
            r = http.post("/v1/workloads", json=spec, headers=auth)
            assert r.status_code in (200, 201, 202), r.text
            obs = Observer(r.json()["workload_id"], auth)

            def trained() -> dict[str, Any] | None:
                st = obs.status(http)
                ok = st["jobs_completed"] >= 1 and checkpoint_versions(run_dir, TENANT)
                return st if ok else None

            wait_for("a completed job and a checkpoint", trained)
        srv.sigkill()

    killed = _jobs_of(scheduler_jobs(run_dir, tmp_path / "at_kill"), obs.wid)
    ledger_at_kill = latest_ledger(run_dir, TENANT)
    done_at_kill = sum(1 for j in killed if j.state is JobState.COMPLETED)
    assert done_at_kill >= 1 and ledger_at_kill["workload_id"] == obs.wid, ledger_at_kill
    assert done_at_kill < TARGET, "the workload finished before the kill"
    resumed_from.append(max(checkpoint_versions(run_dir, TENANT)))

    # --- second server: the workload resumes by itself; one more job, then SIGTERM.
    with serve(run_dir, log) as srv:
        with srv.client() as http:
            # The tenant store survived: the key issued before the kill still works.
            me = http.get("/v1/me", headers=auth)
            assert me.status_code == 200 and me.json()["tenant_id"] == TENANT, me.text
            _listed_again(obs, http, restarts=1)
            in_flight = _check_reconciled(killed, ledger_at_kill, http, auth)
            # Completed before the kill, plus the one the ledger proves applied.
            base = done_at_kill + (ledger_at_kill.get("job_id") in in_flight)
            st = wait_for(
                "a job completed after the restart", lambda: obs.progressed(http, base + 1)
            )
            assert st["state"] == "running", f"the workload finished before the SIGTERM: {st}"
        srv.sigterm()

    stopped = _jobs_of(scheduler_jobs(run_dir, tmp_path / "at_term"), obs.wid)
    ledger_at_term = latest_ledger(run_dir, TENANT)
    resumed_from.append(max(checkpoint_versions(run_dir, TENANT)))
    # A clean stop lets the actor finish recording an update it trained: the job the
    # latest checkpoint names is never failed (the weights never run ahead of the jobs).
    applied = {j.job_id: j for j in stopped}.get(ledger_at_term.get("job_id", ""))
    assert applied is None or applied.state is not JobState.FAILED, applied

    # --- third server: resumes once more (a clean stop is a restart like any other).
    with serve(run_dir, log) as srv:
        with srv.client() as http:
            _listed_again(obs, http, restarts=2)
            _check_reconciled(stopped, ledger_at_term, http, auth)

            def finished() -> dict[str, Any] | None:
                st = obs.status(http)
                return st if st["state"] == "completed" else None

            final = wait_for("the resumed workload to complete", finished)
            resumed = http.get(
                f"/v1/workloads/{obs.wid}/metrics", params={"kind": "resumed"}, headers=auth
            ).json()["records"]
            trains = http.get(
                f"/v1/workloads/{obs.wid}/metrics", params={"kind": "train"}, headers=auth
            ).json()["records"]
            ready = http.get("/readyz")
            assert ready.status_code == 200, ready.text
        srv.sigterm()

    # Each restart resumed from the tenant's latest checkpoint, never from version 0.
    assert [r["policy_version"] for r in resumed] == resumed_from
    assert final["restarts"] == 2 and final["error"] is None, final
    # Exactly the target: admission counts jobs in flight toward it.
    assert final["jobs_completed"] == TARGET, final
    # The served version never went back, across the kill and the clean stop.
    assert obs.served, "predict never answered"
    assert obs.served == sorted(obs.served), f"a served version went back: {obs.served}"

    after = _jobs_of(scheduler_jobs(run_dir, tmp_path / "after"), obs.wid)
    assert all(j.is_terminal for j in after), [j for j in after if not j.is_terminal]
    completed = [j for j in after if j.state is JobState.COMPLETED]
    assert len(completed) == TARGET
    # A job's update is trained and recorded once: no job trained again after a restart.
    trained_ids = [r["job_id"] for r in trains]
    assert len(trained_ids) == len(set(trained_ids)), trained_ids
    assert set(trained_ids) <= {j.job_id for j in completed}
    # Nothing failed but what the kill and the stop left behind.
    failed = [j for j in after if j.state is JobState.FAILED]
    assert all(j.terminal_reason in STOP_REASONS for j in failed), failed
    # Rollouts after a restart come from the resumed policy, never from an older one.
    before_kill = {j.job_id for j in killed}
    later = [j for j in completed if j.job_id not in before_kill]
    assert all((j.behavior_policy_version or 0) >= resumed_from[0] for j in later), later

    figures = {
        "completed": len(completed),
        "failed": sorted(str(j.terminal_reason) for j in failed),
        "resumed_from": resumed_from,
        "final_version": final["policy_version"],
        "served": obs.served[-1],
        "restarts": final["restarts"],
    }
    print(f"restart figures: {figures}")
    # One update (one version) per job: the final weights hold exactly the target's
    # updates, none lost, none applied twice.
    assert final["policy_version"] == TARGET, final
    assert latest_ledger(run_dir, TENANT)["jobs_applied"] == TARGET
