"""``jobs_failed`` counts the jobs that failed by their own fault, not restarts.

Regression: a job the service failed because it restarted a role (or the whole
process) showed in the workload's ``jobs_failed`` although the Master itself never
counts it against the workload, so a workload that completed cleanly after a restart
reported failures. Here the training role's slots are lost while jobs are in flight,
the Master restarts the role, and the jobs it caught end ``role_restarted``.
"""

from __future__ import annotations

from pathlib import Path

from joynexus.api import WorkloadState
from joynexus.control.job import JobState
from joynexus.master.service import ROLE_RESTARTED_REASON
from tests.fakes.plane import FakeServer, rl_spec

A = "alice"


def test_restart_failed_jobs_are_not_counted_as_failed(tmp_path: Path) -> None:
    srv = FakeServer(tmp_path, max_failures=2)
    try:
        srv.plane.inference.rollout_delay_s = 0.002
        wid = srv.run(srv.master.lifecycle.submit(rl_spec(A, target=6), A)).workload_id
        srv.run_until(lambda: srv.master.reporter.status(A, wid).jobs_completed >= 2)
        srv.plane.training.lose_slots()
        srv.sleep(0.5)  # the actor leases and meets the missing slot before the restart
        srv.run(srv.master.recovery.restart_training())
        done = srv.run(srv.master.lifecycle.wait(wid, timeout_s=10))
        failed = [
            j
            for j in srv.plane.scheduler.list_jobs(state=JobState.FAILED)
            if j.metadata.get("workload_id") == wid
        ]
        assert failed, "no job was caught in the window: the test proves nothing"
        assert {j.terminal_reason for j in failed} == {ROLE_RESTARTED_REASON}
        assert done.state is WorkloadState.COMPLETED and done.jobs_completed == 6
        assert done.jobs_failed == 0
    finally:
        srv.close()
