"""Fault test: ``joynexus serve`` SIGKILLed during training, restarted on the same run dir.

The server runs as a real subprocess (127.0.0.1, a free port, a tmp run directory, the
tiny backbone). A tenant's reach2d RL workload trains with a checkpoint after every
update; once a job has completed and a checkpoint exists the server is SIGKILLed. The
restarted server must recover the durable scheduler state (completed jobs stay
completed, jobs left in flight are failed ``runtime_restarted``), and the resubmitted
workload must resume from the tenant's latest checkpoint: no job lost, none completed
twice, policy versions never going backwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx

from joynexus.control.job import JobState, TrainingJob
from joynexus.control.scheduler import TrainingScheduler
from tests.server.livesrv import reach_rl

BASE = "tiny:qwen2_5_vl"
START_TIMEOUT_S = 90.0
WAIT_TIMEOUT_S = 90.0

T = TypeVar("T")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = WAIT_TIMEOUT_S) -> T:
    """Poll ``probe`` until it returns a value (real server: real time, bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@contextmanager
def _server(run_dir: Path, log: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``joynexus serve`` as a subprocess; yields (base URL, process); always killed."""
    port = _free_port()
    cmd = [
        str(Path(sys.executable).with_name("joynexus")),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--run-dir",
        str(run_dir),
        "--base-model",
        BASE,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool | None:
            assert proc.poll() is None, f"server exited {proc.returncode}: {log.read_text()}"
            try:
                return httpx.get(f"{url}/healthz", timeout=2).status_code == 200 or None
            except httpx.TransportError:
                return None

        _wait_for("the server to answer /healthz", ready, START_TIMEOUT_S)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _snapshot(run_dir: Path, into: Path) -> list[TrainingJob]:
    """Every job in the run's scheduler file, read from a copy (the original untouched)."""
    into.mkdir()
    for f in run_dir.glob("scheduler.sqlite*"):
        shutil.copy2(f, into / f.name)
    sched = TrainingScheduler.open(into / "scheduler.sqlite")
    try:
        return sched.list_jobs()
    finally:
        sched.close()


def _checkpoint_versions(run_dir: Path, tenant: str) -> list[int]:
    root = run_dir / "outputs" / tenant
    return sorted(
        int(p.parent.name.removeprefix("step_")) for p in root.glob("step_*/manifest.json")
    )


def test_sigkill_server_during_training_then_restart(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "serve.log"
    spec: dict[str, Any] = reach_rl("alice", BASE, target=1000)
    spec["scheduling"]["checkpoint_every"] = 1

    # --- first server: train until a job completed and a checkpoint exists, then SIGKILL.
    with _server(run_dir, log) as (url, proc):
        admin = (run_dir / "admin.key").read_text().strip()
        with httpx.Client(base_url=url, timeout=30) as http:
            r = http.post(
                "/v1/tenants",
                json={"tenant_id": "alice"},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert r.status_code == 201, r.text
            auth = {"Authorization": f"Bearer {r.json()['api_key']}"}
            r = http.post("/v1/workloads", json=spec, headers=auth)
            assert r.status_code in (200, 201, 202), r.text
            wid = r.json()["workload_id"]

            def trained() -> dict[str, Any] | None:
                st: dict[str, Any] = http.get(f"/v1/workloads/{wid}/status", headers=auth).json()
                assert st["state"] not in ("failed", "cancelled", "completed"), str(st)
                ok = st["jobs_completed"] >= 1 and _checkpoint_versions(run_dir, "alice")
                return st if ok else None

            _wait_for("a completed job and a checkpoint", trained)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    before = {j.job_id: j for j in _snapshot(run_dir, tmp_path / "at_kill")}
    done_before = {jid for jid, j in before.items() if j.state is JobState.COMPLETED}
    in_flight = {jid for jid, j in before.items() if not j.is_terminal}
    checkpoint = max(_checkpoint_versions(run_dir, "alice"))
    assert done_before and checkpoint >= 1
    # A job completes only after its update was checkpointed (checkpoint_every = 1).
    assert checkpoint >= len(done_before)

    # --- second server on the same run directory: recover, resubmit, resume.
    with _server(run_dir, log) as (url, proc):
        with httpx.Client(base_url=url, timeout=30) as http:
            # The tenant store survived: the key issued before the kill still works.
            me = http.get("/v1/me", headers=auth)
            assert me.status_code == 200 and me.json()["tenant_id"] == "alice", me.text
            jobs = http.get("/v1/scheduler/jobs", headers=auth)
            assert jobs.status_code == 200, jobs.text
            recovered = {j["job_id"]: j for j in jobs.json()}
            assert set(recovered) == set(before)  # scheduler state recovered, nothing lost
            for jid in done_before:
                assert recovered[jid]["state"] == "completed"
            for jid in in_flight:
                assert recovered[jid]["state"] == "failed"
                assert recovered[jid]["terminal_reason"] == "runtime_restarted"

            spec["scheduling"]["completion_target"] = 2
            r = http.post("/v1/workloads", json=spec, headers=auth)
            assert r.status_code in (200, 201, 202), r.text
            wid = r.json()["workload_id"]

            def finished() -> dict[str, Any] | None:
                st: dict[str, Any] = http.get(f"/v1/workloads/{wid}/status", headers=auth).json()
                assert st["state"] not in ("failed", "cancelled"), st
                return st if st["state"] == "completed" else None

            final = _wait_for("the resumed workload to complete", finished)
            resumed = http.get(
                f"/v1/workloads/{wid}/metrics", params={"kind": "resumed"}, headers=auth
            ).json()["records"]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)

    # The tenant resumed from its checkpoint, not from version 0.
    assert [r["policy_version"] for r in resumed] == [checkpoint]
    # The target is a floor: jobs already in flight when it is reached still finish.
    assert final["jobs_completed"] >= 2
    # One update per job on top of the checkpoint: no rewind, no update applied twice.
    assert final["policy_version"] == checkpoint + final["jobs_completed"]

    after = _snapshot(run_dir, tmp_path / "after")
    ids = [j.job_id for j in after]
    assert len(ids) == len(set(ids))
    assert all(j.is_terminal for j in after), [j for j in after if not j.is_terminal]
    by_id = {j.job_id: j for j in after}
    assert all(by_id[jid].state is JobState.COMPLETED for jid in done_before)
    new_completed = [j for j in after if j.job_id not in before and j.state is JobState.COMPLETED]
    assert len(new_completed) == final["jobs_completed"]
    # Rollouts after the restart are produced by the resumed policy: their behaviour
    # versions never go back below the checkpoint.
    assert all((j.behavior_policy_version or 0) >= checkpoint for j in new_completed)
