"""A full disk from any layer under the Master (issue 43, item 4).

The full disk is injected, never made: the fake training service's checkpoint writer
raises what safetensors or SQLite raise on a full disk, and the job and workload
stores' writes raise SQLite's "database or disk is full". In every case the workload
must show the fault while it lasts, never fail, lose no committed job, and resume by
itself once writes succeed again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors import SafetensorError

from joynexus.api import WorkloadState
from joynexus.control.job import JobState, TaskType
from joynexus.control.store import SQLiteJobStore
from joynexus.master.store import SQLiteWorkloadStore
from joynexus.workflows.context import STORAGE_FULL_REASON
from tests.fakes.plane import FakeServer, checkpointed_state, rl_spec

A, B = "alice", "bob"

#: What each layer raises when its write finds the disk full (as seen on a full tmpfs).
FULL_DISK: dict[str, Callable[[], Exception]] = {
    "safetensors": lambda: SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    ),
    "sqlite": lambda: sqlite3.OperationalError("database or disk is full"),
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeServer]:
    srv = FakeServer(tmp_path / "run")  # default job-failure budget: 5
    yield srv
    srv.close()


def _jobs(server: FakeServer, wid: str, state: JobState, tenant: str = A) -> list[Any]:
    return [
        j
        for j in server.plane.scheduler.list_jobs(tenant_id=tenant, state=state)
        if j.metadata.get("workload_id") == wid
    ]


def _assert_committed_jobs_are_the_checkpoint(server: FakeServer, wid: str) -> None:
    """Pause, drain, and compare: the checkpoint holds exactly the completed jobs."""
    m = server.master
    server.run(m.lifecycle.pause(A, wid))
    server.run_until(lambda: m.reporter.status(A, wid).jobs_in_flight == 0, what="drained")
    ck = checkpointed_state(server.plane.output_root, A)
    assert ck is not None
    done = [j.job_id for j in _jobs(server, wid, JobState.COMPLETED) if j.task_type is TaskType.RL]
    assert sorted(ck["applied"]) == sorted(done)


@pytest.mark.parametrize("source", sorted(FULL_DISK))
def test_a_checkpoint_write_failing_full_shows_fault_and_resumes(
    server: FakeServer, source: str
) -> None:
    m, training = server.master, server.plane.training
    wid = server.run(m.lifecycle.submit(rl_spec(A, target=100_000), A)).workload_id
    server.run_until(lambda: len(_jobs(server, wid, JobState.COMPLETED)) >= 2, what="2 done")

    def full(path: Path, text: str) -> object:
        raise FULL_DISK[source]()

    training.write_text = full
    # More failed saves than the workload's failure budget (5): none counts against it.
    server.run_until(
        lambda: (
            sum(
                j.terminal_reason == STORAGE_FULL_REASON
                for j in _jobs(server, wid, JobState.FAILED)
            )
            >= 8
        ),
        what="saves failing storage_full",
    )
    st = m.reporter.status(A, wid)
    assert st.state is WorkloadState.RUNNING and st.jobs_failed == 0, st
    assert st.fault is not None and "checkpoint writes fail" in st.fault, st

    training.write_text = Path.write_text  # space is freed
    completed = len(_jobs(server, wid, JobState.COMPLETED))
    server.run_until(
        lambda: len(_jobs(server, wid, JobState.COMPLETED)) >= completed + 3, what="resumed"
    )
    st = m.reporter.status(A, wid)
    assert st.state is WorkloadState.RUNNING and st.fault is None and st.jobs_failed == 0, st
    _assert_committed_jobs_are_the_checkpoint(server, wid)


class _FullSwitch:
    """Makes the job store's and the workload store's SQLite writes (and the
    checkpoint writer) fail as on a full disk while ``full`` is set."""

    def __init__(self, server: FakeServer) -> None:
        self.full = False
        self.refused = 0
        jobs = server.plane.scheduler._store  # the instance's writes are wrapped
        records = server.plane.store
        assert isinstance(jobs, SQLiteJobStore) and isinstance(records, SQLiteWorkloadStore)
        jobs_write, records_put = jobs.write, records.put

        def guard(write: Callable[..., None]) -> Callable[..., None]:
            def wrapped(*args: Any) -> None:
                if self.full:
                    self.refused += 1
                    raise sqlite3.OperationalError("database or disk is full")
                write(*args)

            return wrapped

        jobs.write = guard(jobs_write)  # type: ignore[method-assign]
        records.put = guard(records_put)  # type: ignore[method-assign]

        def checkpoint(path: Path, text: str) -> object:
            if self.full:
                raise FULL_DISK["safetensors"]()
            return path.write_text(text)

        server.plane.training.write_text = checkpoint


def test_a_full_disk_under_every_store_loses_no_job_and_fails_nothing(
    server: FakeServer,
) -> None:
    """The finding: the job store could not record the failed job, its lease expired,
    it was leased again without its partition (``partition_not_found``) and the
    workload ended ``failed``. Now its end waits for the disk."""
    m = server.master
    wid = server.run(m.lifecycle.submit(rl_spec(A, target=100_000), A)).workload_id
    server.run_until(lambda: len(_jobs(server, wid, JobState.COMPLETED)) >= 2, what="2 done")
    switch = _FullSwitch(server)
    switch.full = True
    # While the disk is full every loop (producers, stages, actor) backs off 0.5 s between
    # tries, so 20 refused writes take several seconds of wall time: a 10 s wait was a
    # coin toss.
    server.run_until(lambda: switch.refused >= 20, what="writes refused", timeout_s=40)
    server.run_until(lambda: m.reporter.status(A, wid).fault is not None, what="fault shown")
    assert m.reporter.status(A, wid).state is WorkloadState.RUNNING
    server.sleep(0.3)  # the loops keep trying meanwhile
    switch.full = False  # space is freed
    completed = len(_jobs(server, wid, JobState.COMPLETED))
    server.run_until(
        lambda: len(_jobs(server, wid, JobState.COMPLETED)) >= completed + 3,
        what="resumed",
        timeout_s=30,
    )
    st = m.reporter.status(A, wid)
    assert st.state is WorkloadState.RUNNING and st.fault is None, st
    counted = [
        j.terminal_reason
        for j in _jobs(server, wid, JobState.FAILED)
        if j.terminal_reason != STORAGE_FULL_REASON
    ]
    assert counted == [] and st.jobs_failed == 0, counted
    _assert_committed_jobs_are_the_checkpoint(server, wid)


def test_retention_keeps_exactly_keep_last(server: FakeServer) -> None:
    m = server.master
    spec = rl_spec(A, target=7)
    spec = spec.model_copy(
        update={
            "scheduling": spec.scheduling.model_copy(
                update={"keep_last": 2, "checkpoint_every": 1}  # the finding's setting
            )
        }
    )
    wid = server.run(m.lifecycle.submit(spec, A)).workload_id
    server.run_until(
        lambda: m.reporter.status(A, wid).state is WorkloadState.COMPLETED,
        what="completed",
        timeout_s=20,
    )
    steps = sorted(p.name for p in (server.plane.output_root / A).glob("step_*"))
    assert len(steps) == 2, steps
    ck = checkpointed_state(server.plane.output_root, A)
    assert ck is not None and steps[-1] == f"step_{ck['step']}"


def test_a_tenant_past_its_disk_quota_waits_and_the_other_trains_on(
    server: FakeServer,
) -> None:
    m = server.master
    limits: dict[str, int | None] = {A: None, B: None}
    m.disk.limit_of = limits.get
    wa = server.run(m.lifecycle.submit(rl_spec(A, target=100_000), A)).workload_id
    wb = server.run(m.lifecycle.submit(rl_spec(B, target=100_000), B)).workload_id
    server.run_until(lambda: len(_jobs(server, wa, JobState.COMPLETED)) >= 2, what="A ran")
    limits[A] = 1  # alice is past her quota from now on
    server.run_until(
        lambda: (m.reporter.status(A, wa).fault or "").find("disk quota") >= 0, what="fault"
    )
    b_done = len(_jobs(server, wb, JobState.COMPLETED, B))
    server.run_until(
        lambda: len(_jobs(server, wb, JobState.COMPLETED, B)) >= b_done + 3, what="bob trains on"
    )
    assert m.reporter.status(B, wb).fault is None
    st = m.reporter.status(A, wa)
    assert st.state is WorkloadState.RUNNING and st.jobs_failed == 0, st
    limits[A] = None  # an operator raised the quota
    a_done = len(_jobs(server, wa, JobState.COMPLETED))
    server.run_until(
        lambda: len(_jobs(server, wa, JobState.COMPLETED)) >= a_done + 3, what="alice resumed"
    )
    assert m.reporter.status(A, wa).fault is None
