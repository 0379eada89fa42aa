"""The Master Service's behaviour on the fake execution plane (milliseconds per test).

Real Master, workflow loops, Training Scheduler (SQLite), Training Queue, workload
store and checkpoint manifests; fake model services and simulator
(:mod:`tests.fakes.plane`). A restart is a new "process" on the same run directory:
``kill=True`` abandons the old event loop where it stands (``kill -9``), ``kill=False``
closes the Master cleanly first.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joynexus.api import WorkloadState, WorkloadStatus
from joynexus.control.job import JobState, TaskType, TrainingJob
from joynexus.errors import (
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    ServiceUnavailableError,
)
from joynexus.master.service import (
    CANCELLED_REASON,
    RESTARTED_REASON,
    ROLE_RESTARTED_REASON,
    MasterService,
)
from joynexus.models.batch import ObservationBatch
from joynexus.queues.training import TrainingQueue
from joynexus.services.protocols import (
    EnvironmentServiceAPI,
    InferenceModelServiceAPI,
    TrainingModelServiceAPI,
    TrainingQueueAPI,
)
from joynexus.services.training import TrainBatch
from tests.fakes.plane import (
    FakeEnvironmentService,
    FakeInferenceService,
    FakeServer,
    FakeTrainingService,
    checkpointed_state,
    custom_spec,
    eval_spec,
    master_on,
    open_fake_plane,
    rl_spec,
    start_master,
)

A = "alice"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeServer]:
    srv = FakeServer(tmp_path / "run")
    yield srv
    srv.close()


def _status(srv: FakeServer, wid: str, tenant: str = A) -> WorkloadStatus:
    return srv.master.reporter.status(tenant, wid)


def _submit(srv: FakeServer, tenant: str = A, **kw: Any) -> str:
    st = srv.run(srv.master.lifecycle.submit(rl_spec(tenant, **kw), tenant))
    assert st.state is WorkloadState.STARTING
    return st.workload_id


def _wait(srv: FakeServer, wid: str, tenant: str = A) -> WorkloadStatus:
    st = srv.run(srv.master.lifecycle.wait(wid, timeout_s=10))
    assert st.tenant_id == tenant
    return st


def _jobs(srv: FakeServer, wid: str, state: JobState | None = None) -> list[TrainingJob]:
    return [
        j
        for j in srv.plane.scheduler.list_jobs(state=state)
        if j.metadata.get("workload_id") == wid
    ]


def _completed_ids(srv: FakeServer, wid: str) -> list[str]:
    return [j.job_id for j in _jobs(srv, wid, JobState.COMPLETED)]


def _assert_weights_hold_exactly_the_completed_jobs(srv: FakeServer, tenant: str = A) -> None:
    """The Master's durability contract: the completed jobs are exactly the updates in
    the tenant's latest checkpoint, each once."""
    ck = checkpointed_state(srv.plane.output_root, tenant)
    assert ck is not None
    done = [
        j.job_id
        for j in srv.plane.scheduler.list_jobs(tenant_id=tenant, state=JobState.COMPLETED)
        if j.task_type is TaskType.RL
    ]
    assert len(ck["applied"]) == len(set(ck["applied"])), "an update is in the weights twice"
    assert sorted(ck["applied"]) == sorted(done)
    assert ck["ledger"]["jobs_applied"] == len(done)


# ------------------------------------------------------------------------- the fakes


@pytest.mark.parametrize(
    ("protocol", "fake"),
    [
        (TrainingModelServiceAPI, FakeTrainingService),
        (InferenceModelServiceAPI, FakeInferenceService),
        (EnvironmentServiceAPI, FakeEnvironmentService),
        (TrainingQueueAPI, TrainingQueue),
    ],
)
def test_fakes_have_every_protocol_member_with_its_signature(protocol: Any, fake: Any) -> None:
    members = [n for n in vars(protocol) if not n.startswith("_")]
    assert members, protocol
    for name in members:
        want, got = vars(protocol)[name], getattr(fake, name, None)
        assert got is not None, f"{fake.__name__} lacks {name}"
        if isinstance(want, property):
            assert isinstance(got, property), f"{fake.__name__}.{name} is not a property"
            continue
        assert inspect.iscoroutinefunction(want) == inspect.iscoroutinefunction(got), name
        params = [(p.name, p.kind) for p in inspect.signature(want).parameters.values()]
        mine = [(p.name, p.kind) for p in inspect.signature(got).parameters.values()]
        assert mine == params, f"{fake.__name__}.{name}{inspect.signature(got)}"


def test_a_fake_plane_takes_an_in_memory_workload_store(tmp_path: Path) -> None:
    from joynexus.master.store import InMemoryWorkloadStore

    async def main() -> None:
        store = InMemoryWorkloadStore()
        plane = open_fake_plane(tmp_path, store=store)
        master = await start_master(master_on(plane))
        st = await master.lifecycle.submit(rl_spec(A, target=2), A)
        done = await master.lifecycle.wait(st.workload_id, timeout_s=10)
        assert done.state is WorkloadState.COMPLETED and done.jobs_completed == 2
        assert [r.state for r in store.load()] == [WorkloadState.COMPLETED]
        assert plane.inference.current_policy_version(A) == 2
        await master.aclose()

    asyncio.run(main())


# ----------------------------------------------------------------------- lifecycle


@pytest.mark.parametrize("steps_per_job", [1, 2])
def test_rl_workload_runs_to_its_completion_target(server: FakeServer, steps_per_job: int) -> None:
    wid = _submit(server, target=3, microbatch_size=4 // steps_per_job)
    st = _wait(server, wid)
    assert st.state is WorkloadState.COMPLETED, st
    assert (st.jobs_completed, st.jobs_target, st.jobs_failed, st.jobs_in_flight) == (3, 3, 0, 0)
    assert st.policy_version == 3 * steps_per_job  # one version per optimizer step
    fakes = server.plane
    published = fakes.inference.published[A]
    assert published[0] == 0 and published[-1] == st.policy_version
    assert published == sorted(published)  # served versions never go back
    assert fakes.inference.current_policy_version(A) == st.policy_version
    # Every completed job was trained exactly once and is in the checkpoint, with its ledger.
    assert sorted(j for _, j, _ in fakes.training.trained) == sorted(_completed_ids(server, wid))
    _assert_weights_hold_exactly_the_completed_jobs(server)
    ck = checkpointed_state(fakes.output_root, A)
    assert ck is not None and ck["version"] == st.policy_version
    assert ck["ledger"]["workload_id"] == wid
    # Nothing is left behind: partitions cleared, session closed.
    assert fakes.queue.partitions() == []
    assert st.session_id in fakes.env.closed and fakes.env.open_sessions(A) == []
    states = [r["state"] for r in server.master.reporter.metrics(A, wid, kind="lifecycle").records]
    assert states == ["running", "completed"]


def test_a_later_workload_never_changes_an_ended_workloads_counts(server: FakeServer) -> None:
    # Per-workload counts count that workload's jobs only (tagged with its id), never
    # the tenant's later ones; its version stays the one it ended with.
    first = _wait(server, _submit(server, target=2))
    second = _wait(server, _submit(server, target=3))
    assert (second.jobs_completed, second.jobs_target) == (3, 3)
    again = _status(server, first.workload_id)
    assert (again.jobs_completed, again.jobs_target, again.jobs_failed) == (2, 2, 0)
    assert again.policy_version == first.policy_version
    assert second.policy_version is not None and first.policy_version is not None
    assert second.policy_version > first.policy_version  # resumed from the first's weights


def test_pause_stops_new_jobs_until_resume(server: FakeServer) -> None:
    server.plane.inference.rollout_delay_s = 0.005
    wid = _submit(server, target=6)
    server.run_until(lambda: _status(server, wid).jobs_completed >= 1, what="first job")
    paused = server.run(server.master.lifecycle.pause(A, wid))
    assert paused.state is WorkloadState.PAUSED
    server.run_until(lambda: _status(server, wid).jobs_in_flight == 0, what="in-flight drain")
    reserved = len(_jobs(server, wid))
    server.sleep(0.1)
    st = _status(server, wid)
    assert st.state is WorkloadState.PAUSED
    assert len(_jobs(server, wid)) == reserved, "a paused workload reserved a job"
    assert st.jobs_completed < 6
    with pytest.raises(ConflictError):
        server.run(server.master.lifecycle.pause(A, wid))
    assert server.run(server.master.lifecycle.resume(A, wid)).state is WorkloadState.RUNNING
    with pytest.raises(ConflictError):
        server.run(server.master.lifecycle.resume(A, wid))
    done = _wait(server, wid)
    assert done.state is WorkloadState.COMPLETED and done.jobs_completed == 6
    events = [r["state"] for r in server.master.reporter.metrics(A, wid, kind="lifecycle").records]
    assert events == ["running", "paused", "resumed", "completed"]


def test_cancel_releases_the_slot_and_is_final(server: FakeServer) -> None:
    server.plane.inference.rollout_delay_s = 0.005
    wid = _submit(server, target=50)
    server.run_until(lambda: _status(server, wid).jobs_completed >= 1, what="first job")
    st = server.run(server.master.lifecycle.cancel(A, wid))
    assert st.state is WorkloadState.CANCELLED and st.finished_at is not None
    fakes = server.plane
    assert A not in fakes.training.tenant_ids() and A not in fakes.inference.tenant_ids()
    assert fakes.env.open_sessions(A) == []
    jobs = _jobs(server, wid)
    assert all(j.is_terminal for j in jobs)
    assert {j.terminal_reason for j in jobs if j.state is JobState.FAILED} <= {CANCELLED_REASON}
    server.sleep(0.05)
    assert len(_jobs(server, wid)) == len(jobs), "a cancelled workload reserved a job"
    again = server.run(
        server.master.lifecycle.cancel(A, wid)
    )  # a finished workload is left as it is
    assert again.state is WorkloadState.CANCELLED and again.finished_at == st.finished_at
    for op in (server.master.lifecycle.pause, server.master.lifecycle.resume):
        with pytest.raises(ConflictError):
            server.run(op(A, wid))
    # The tenant may start over; it resumes from its checkpoint, never below it.
    before = checkpointed_state(fakes.output_root, A)
    assert before is not None
    wid2 = _submit(server, target=1)
    done = _wait(server, wid2)
    assert done.state is WorkloadState.COMPLETED and done.policy_version == before["version"] + 1


def test_illegal_transitions_raise_the_documented_errors(server: FakeServer) -> None:
    m = server.master

    async def submit_then_pause() -> str:
        st = await m.lifecycle.submit(rl_spec(A, target=2), A)
        with pytest.raises(ConflictError, match="cannot be paused"):  # still starting
            await m.lifecycle.pause(A, st.workload_id)
        return st.workload_id

    wid = server.run(submit_then_pause())
    with pytest.raises(ConflictError, match="already runs trainable workload"):
        server.run(m.lifecycle.submit(rl_spec(A), A))
    with pytest.raises(PermissionDeniedError):
        server.run(m.lifecycle.submit(rl_spec(A), "bob"))
    # Another tenant's workload answers like an unknown one (ids are no oracle).
    for op in (m.lifecycle.pause, m.lifecycle.resume, m.lifecycle.cancel):
        with pytest.raises(NotFoundError):
            server.run(op("bob", wid))
        with pytest.raises(NotFoundError):
            server.run(op(A, "wl-404-none"))
    with pytest.raises(NotFoundError):
        m.reporter.status("bob", wid)
    assert _status(server, wid).state is not WorkloadState.CANCELLED  # bob changed nothing
    server.run_until(lambda: _status(server, wid).state is not WorkloadState.STARTING)
    with pytest.raises(ConflictError, match="not paused"):
        server.run(m.lifecycle.resume(A, wid))
    done = _wait(server, wid)
    assert done.state is WorkloadState.COMPLETED
    for op in (m.lifecycle.pause, m.lifecycle.resume):
        with pytest.raises(ConflictError):
            server.run(op(A, wid))
    assert server.run(m.lifecycle.cancel(A, wid)).state is WorkloadState.COMPLETED  # left as it is


# ------------------------------------------------------------------------- restarts


@pytest.mark.parametrize("kill", [True, False], ids=["kill-9", "clean"])
@pytest.mark.parametrize("after_jobs", [1, 3])
def test_a_restarted_master_resumes_and_completes_the_workload(
    server: FakeServer, kill: bool, after_jobs: int
) -> None:
    server.plane.inference.rollout_delay_s = 0.002
    wid = _submit(server, target=5)
    server.run_until(lambda: _status(server, wid).jobs_completed >= after_jobs, what="progress")
    before = _status(server, wid)
    served_before = max(server.plane.inference.published[A])
    server.restart(kill=kill)
    assert wid in server.master.reporter.workload_ids()  # the restart lost nothing
    done = _wait(server, wid)
    assert done.state is WorkloadState.COMPLETED, done
    assert done.restarts == 1 and done.jobs_completed == 5 == done.jobs_target
    assert done.jobs_completed >= before.jobs_completed
    assert done.policy_version is not None and done.policy_version >= served_before
    published = server.plane.inference.published[A]
    assert published[0] >= served_before and published == sorted(published)
    completed = _completed_ids(server, wid)
    assert len(completed) == len(set(completed)) == 5
    failed = _jobs(server, wid, JobState.FAILED)
    assert {j.terminal_reason for j in failed} <= {RESTARTED_REASON, CANCELLED_REASON}
    _assert_weights_hold_exactly_the_completed_jobs(server)
    events = [r["state"] for r in server.master.reporter.metrics(A, wid, kind="lifecycle").records]
    assert events == ["running", "resumed_after_restart", "running", "completed"]


def test_kill_between_checkpoint_and_complete_completes_that_job_once(
    server: FakeServer,
) -> None:
    hung: list[str] = []

    async def hang_after_second_checkpoint(tenant: str, step: int, ledger: dict[str, Any]) -> None:
        if step == 2 and "job_id" in ledger:
            hung.append(ledger["job_id"])
            await asyncio.Event().wait()

    server.plane.training.on_saved = hang_after_second_checkpoint
    wid = _submit(server, target=4)
    server.run_until(lambda: bool(hung), what="the second checkpoint")
    job = server.plane.scheduler.get(hung[0])
    assert job.state is JobState.LEASED  # its update is durable, its complete() is not
    server.restart(kill=True)
    assert server.plane.scheduler.get(hung[0]).state is JobState.COMPLETED  # reconciled
    done = _wait(server, wid)
    assert done.state is WorkloadState.COMPLETED and done.jobs_completed == 4
    assert done.policy_version == 4  # 4 updates, 4 versions: none reissued, none lost
    # The new process never trained the reconciled job again.
    assert hung[0] not in [j for _, j, _ in server.plane.training.trained]
    _assert_weights_hold_exactly_the_completed_jobs(server)


@pytest.mark.parametrize("kill", [True, False], ids=["kill-9", "clean"])
def test_paused_stays_paused_and_ended_stays_ended_after_restart(
    server: FakeServer, kill: bool
) -> None:
    m = server.master
    server.plane.inference.rollout_delay_s = 0.002
    done_wid = _submit(server, "bob", target=2)
    cancelled_wid = _submit(server, "carol", target=50)
    paused_wid = _submit(server, A, target=50)
    assert _wait(server, done_wid, "bob").state is WorkloadState.COMPLETED
    server.run_until(lambda: _status(server, paused_wid).jobs_completed >= 1)
    server.run(m.lifecycle.pause(A, paused_wid))
    server.run_until(lambda: _status(server, cancelled_wid, "carol").jobs_completed >= 1)
    server.run(m.lifecycle.cancel("carol", cancelled_wid))
    server.run_until(lambda: _status(server, paused_wid).jobs_in_flight == 0)
    paused_jobs = len(_jobs(server, paused_wid))
    ended = {w: _status(server, w, t) for w, t in ((done_wid, "bob"), (cancelled_wid, "carol"))}

    server.restart(kill=kill)
    m = server.master
    server.run_until(lambda: _status(server, paused_wid).state is not WorkloadState.STARTING)
    server.sleep(0.05)
    st = _status(server, paused_wid)
    assert st.state is WorkloadState.PAUSED and st.restarts == 1
    assert len(_jobs(server, paused_wid)) == paused_jobs, "a paused workload reserved a job"
    for w, t in ((done_wid, "bob"), (cancelled_wid, "carol")):
        now = _status(server, w, t)
        assert (now.state, now.finished_at, now.jobs_completed, now.restarts) == (
            ended[w].state,
            ended[w].finished_at,
            ended[w].jobs_completed,
            0,
        )
    # The completed tenant's last policy is served again; the cancelled one's is not.
    assert server.plane.inference.current_policy_version("bob") == ended[done_wid].policy_version
    assert "carol" not in server.plane.inference.tenant_ids()
    assert server.run(m.lifecycle.resume(A, paused_wid)).state is WorkloadState.RUNNING
    assert _wait(server, paused_wid).jobs_completed == 50


@pytest.mark.parametrize("kill", [True, False], ids=["kill-9", "clean"])
def test_fail_live_ends_live_workloads_failed_with_the_reason(
    server: FakeServer, kill: bool
) -> None:
    m = server.master
    server.plane.inference.rollout_delay_s = 0.002
    done_wid = _submit(server, "bob", target=1)
    assert _wait(server, done_wid, "bob").state is WorkloadState.COMPLETED
    running_wid = _submit(server, A, target=50)
    paused_wid = _submit(server, "carol", target=50)
    server.run_until(lambda: _status(server, paused_wid, "carol").jobs_completed >= 1)
    server.run(m.lifecycle.pause("carol", paused_wid))
    server.run_until(lambda: _status(server, running_wid).state is WorkloadState.RUNNING)

    reason = "training role: recovery budget spent (3 restarts in 60 s)"
    ended = server.run(m.supervisor.fail_live(reason))
    assert sorted(ended) == sorted([running_wid, paused_wid])
    for w, t in ((running_wid, A), (paused_wid, "carol")):
        st = _status(server, w, t)
        assert (st.state, st.error, st.jobs_in_flight) == (WorkloadState.FAILED, reason, 0)
    assert _status(server, done_wid, "bob").state is WorkloadState.COMPLETED
    assert server.run(m.supervisor.fail_live("again")) == []  # nothing live is left
    jobs = len(_jobs(server, running_wid))
    server.sleep(0.03)
    assert len(_jobs(server, running_wid)) == jobs, "a failed workload reserved a job"

    server.restart(kill=kill)
    for w, t in ((running_wid, A), (paused_wid, "carol")):
        st = _status(server, w, t)
        assert (st.state, st.error, st.restarts) == (WorkloadState.FAILED, reason, 0)


def test_repeated_training_failures_end_the_workload_failed(tmp_path: Path) -> None:
    srv = FakeServer(tmp_path, max_failures=2)
    try:
        srv.plane.training.fail_job = lambda job: RuntimeError(f"nan loss in {job.job_id}")
        wid = _submit(srv, target=5)
        st = _wait(srv, wid)
        assert st.state is WorkloadState.FAILED and st.jobs_completed == 0
        assert st.error is not None and "training jobs failed" in st.error
        assert "nan loss" in st.error
        assert st.jobs_failed >= 2 and st.jobs_in_flight == 0
        assert srv.plane.inference.current_policy_version(A) == 0  # nothing was published
    finally:
        srv.close()


def test_restart_training_rebuilds_the_slot_from_its_checkpoint(server: FakeServer) -> None:
    server.plane.inference.rollout_delay_s = 0.002
    wid = _submit(server, target=6)
    server.run_until(lambda: _status(server, wid).jobs_completed >= 2)
    server.run(server.master.recovery.restart_training())
    done = _wait(server, wid)
    assert done.state is WorkloadState.COMPLETED and done.jobs_completed == 6
    failed = _jobs(server, wid, JobState.FAILED)
    assert {j.terminal_reason for j in failed} <= {ROLE_RESTARTED_REASON}
    _assert_weights_hold_exactly_the_completed_jobs(server)
    published = server.plane.inference.published[A]
    assert published == sorted(published)


def test_jobs_caught_before_a_recreated_role_is_rebuilt_are_not_the_workloads_fault(
    tmp_path: Path,
) -> None:
    """Ray re-creates the training role after its node was lost; until the Master's
    restart rebuilds the slots, the role answers not_found for every tenant. The jobs
    the actor leases meanwhile fail ``role_restarted`` (not counted), so the workload
    outlives the window however many jobs it catches, and then completes."""
    srv = FakeServer(tmp_path, max_failures=2)
    try:
        srv.plane.inference.rollout_delay_s = 0.002
        wid = _submit(srv, target=6)
        srv.run_until(lambda: _status(srv, wid).jobs_completed >= 2)
        srv.plane.training.lose_slots()
        srv.sleep(0.5)  # the actor leases and meets the missing slot before the restart
        assert _status(srv, wid).state is WorkloadState.RUNNING
        srv.run(srv.master.recovery.restart_training())
        done = _wait(srv, wid)
        assert done.state is WorkloadState.COMPLETED and done.jobs_completed == 6
        failed = _jobs(srv, wid, JobState.FAILED)
        assert failed, "no job was caught in the window: the test proves nothing"
        assert {j.terminal_reason for j in failed} == {ROLE_RESTARTED_REASON}
        _assert_weights_hold_exactly_the_completed_jobs(srv)
    finally:
        srv.close()


def test_a_slot_that_never_comes_back_ends_the_workload_failed(tmp_path: Path) -> None:
    """No restart rebuilds the lost slot within the grace: the failures count, and the
    workload ends failed with the role's own error instead of retrying forever."""
    srv = FakeServer(tmp_path, max_failures=2, restart_grace_s=0.2)
    try:
        wid = _submit(srv, target=6)
        srv.run_until(lambda: _status(srv, wid).jobs_completed >= 1)
        srv.plane.training.lose_slots()
        st = _wait(srv, wid)
        assert st.state is WorkloadState.FAILED
        # The role's not_found for the lost slot (which call meets it first varies).
        assert st.error is not None and "not_found:" in st.error
        assert f"tenant {A!r} has no" in st.error
    finally:
        srv.close()


def test_a_role_lost_after_the_checkpoint_keeps_the_update_counted(server: FakeServer) -> None:
    """The training role dies right after an update's checkpoint reached the disk (the
    save's reply, the publication are lost with it): the job completes anyway, since
    its update is in the weights the restart restores — completed jobs stay exactly
    the checkpointed updates and the final version counts each one once."""
    saves = 0
    lost: list[object] = []

    async def die_after_the_second(tenant: str, step: int, ledger: dict[str, object]) -> None:
        nonlocal saves
        saves += 1
        if saves == 2:
            lost.append(ledger["job_id"])
            raise ServiceUnavailableError("the training actor died")

    server.plane.training.on_saved = die_after_the_second
    wid = _submit(server, target=4)
    server.run_until(lambda: saves >= 2)
    server.run(server.master.recovery.restart_training())
    done = _wait(server, wid)
    assert done.state is WorkloadState.COMPLETED and done.jobs_completed == 4
    assert lost[0] in {j.job_id for j in _jobs(server, wid, JobState.COMPLETED)}
    failed = _jobs(server, wid, JobState.FAILED)  # only those the restart caught in flight
    assert {j.terminal_reason for j in failed} <= {ROLE_RESTARTED_REASON}
    _assert_weights_hold_exactly_the_completed_jobs(server)
    ck = checkpointed_state(server.plane.output_root, A)
    assert ck is not None and ck["ledger"]["jobs_applied"] == 4


def test_a_relative_run_directory_keeps_checkpoints_where_recovery_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``joynexus run --run-dir runs/x`` (relative): the checkpoints land in
    ``runs/x/outputs/<tenant>``, where restart recovery and ``init_from`` look, not in a
    copy of the relative path nested inside it."""
    monkeypatch.chdir(tmp_path)
    srv = FakeServer(Path("runs") / "x")
    try:
        assert srv.master.output_root == tmp_path / "runs" / "x" / "outputs"
        wid = _submit(srv, target=2)
        assert _wait(srv, wid).state is WorkloadState.COMPLETED
        ck = checkpointed_state(tmp_path / "runs" / "x" / "outputs", A)
        assert ck is not None and ck["ledger"]["jobs_applied"] == 2
        assert not (tmp_path / "runs" / "x" / "outputs" / "runs").exists()
    finally:
        srv.close()


def test_watchdog_flags_a_workload_without_progress(tmp_path: Path) -> None:
    srv = FakeServer(tmp_path, watchdog_factor=1.0, watchdog_min_s=0.05)
    try:
        started = asyncio.Event()

        async def stuck(job: TrainingJob, version: int) -> None:
            started.set()
            await asyncio.Event().wait()

        srv.plane.training.on_step = stuck
        wid = _submit(srv, target=2)
        srv.run_until(lambda: _status(srv, wid).stalled is not None, what="stalled")
        assert _status(srv, wid).state is WorkloadState.RUNNING
        assert srv.master.reporter.degraded() and wid in srv.master.reporter.degraded()[0]
        # A suite evaluation's finished task is progress too (minutes pass between
        # evaluation runs).
        w = srv.master.book.workloads[wid]
        before = srv.master.supervisor._progress(w)
        assert w.tenant is not None
        w.tenant.metrics.write("eval_task", task="libero_goal/0", episodes=2, successes=1)
        assert srv.master.supervisor._progress(w) != before
    finally:
        srv.close()


# ------------------------------------------------------------- evaluation, custom


def test_evaluation_reads_the_trained_policy(server: FakeServer) -> None:
    wid = _submit(server, target=2)
    trained = _wait(server, wid)
    st = server.run(server.master.lifecycle.submit(eval_spec(A, [A], runs=2), A))
    done = _wait(server, st.workload_id)
    assert done.state is WorkloadState.COMPLETED, done
    assert done.eval_runs_completed == done.eval_runs_target == 2
    runs = server.master.reporter.metrics(A, st.workload_id, kind="eval").records
    assert [r["version"] for r in runs] == [trained.policy_version] * 2
    assert server.plane.training.policy_version(A) == trained.policy_version  # read-only


def test_custom_workload_updates_are_checkpointed_and_survive_a_kill(server: FakeServer) -> None:
    m = server.master
    st = server.run(m.lifecycle.submit(custom_spec(A), A))
    server.run_until(lambda: _status(server, st.workload_id).state is WorkloadState.RUNNING)
    obs = ObservationBatch(
        cameras={"top": np.zeros((2, 8, 8, 3), np.uint8)},
        state=np.zeros((2, 4), np.float32),
        instructions=["reach", "reach"],
        actions=np.zeros((2, 1, 2), np.float32),
    )
    batch = TrainBatch(obs, loss="reinforce", advantages=np.ones(2, np.float32))
    for expected in (1, 2):
        assert server.run(m.primitives.train_batch(A, batch)).policy_version == expected
    server.restart(kill=True)
    server.run_until(lambda: _status(server, st.workload_id).state is WorkloadState.RUNNING)
    assert server.plane.training.policy_version(A) == 2  # resumed from the checkpoint
    cancelled = server.run(server.master.lifecycle.cancel(A, st.workload_id))
    assert cancelled.state is WorkloadState.CANCELLED
    assert A not in server.plane.training.tenant_ids()


# ------------------------------------------- found on the fake plane (regressions)


def test_clean_shutdown_between_checkpoint_and_complete_keeps_weights_equal_to_jobs(
    server: FakeServer,
) -> None:
    """SIGTERM "resumes exactly like a crash does": a clean close that cancels the actor
    while it records an update (checkpoint written, job not yet completed) must not
    leave that update in the weights of a job failed ``cancelled``."""
    hung: list[str] = []
    release = asyncio.Event()

    async def slow_after_second_checkpoint(tenant: str, step: int, ledger: dict[str, Any]) -> None:
        if step == 2 and "job_id" in ledger:
            hung.append(ledger["job_id"])
            await release.wait()  # the checkpoint is on disk; publish/complete still due

    async def close_while_recording(master: MasterService) -> None:
        closing = asyncio.ensure_future(master.aclose())
        await asyncio.sleep(0.01)  # aclose has cancelled the actor mid-record
        release.set()
        await closing

    server.plane.training.on_saved = slow_after_second_checkpoint
    wid = _submit(server, target=4)
    server.run_until(lambda: bool(hung), what="the second checkpoint")
    server.restart(kill=False, shutdown=close_while_recording)
    done = _wait(server, wid)
    assert done.state is WorkloadState.COMPLETED and done.jobs_completed == 4
    assert server.plane.scheduler.get(hung[0]).state is JobState.COMPLETED
    assert done.policy_version == 4
    _assert_weights_hold_exactly_the_completed_jobs(server)


def test_reported_policy_version_never_goes_back_across_a_kill(server: FakeServer) -> None:
    hung: list[str] = []

    async def hang_after_second_step(job: TrainingJob, version: int) -> None:
        if version == 2:
            hung.append(job.job_id)
            await asyncio.Event().wait()

    server.plane.training.on_step = hang_after_second_step
    wid = _submit(server, target=4)
    server.run_until(lambda: bool(hung), what="the second optimizer step")
    reported = _status(server, wid).policy_version
    assert reported is not None
    server.restart(kill=True)
    server.run_until(lambda: _status(server, wid).state is not WorkloadState.STARTING)
    after = _status(server, wid).policy_version
    assert after is not None and after >= reported, (reported, after)


# ------------------------------------------------- regressions of fixed recovery bugs


@pytest.mark.parametrize("kill", [True, False], ids=["kill-9", "clean"])
def test_paused_stays_paused_across_a_restart_during_recovery(
    server: FakeServer, kill: bool
) -> None:
    wid = _submit(server, target=50)
    server.run_until(lambda: _status(server, wid).jobs_completed >= 1)
    server.run(server.master.lifecycle.pause(A, wid))
    server.restart(kill=False)  # recovery starts: the workload is 'starting' again ...
    server.restart(kill=kill)  # ... and the service goes down again before it settled
    server.run_until(lambda: _status(server, wid).state is not WorkloadState.STARTING)
    assert _status(server, wid).state is WorkloadState.PAUSED


def test_cancelling_a_tenant_mid_training_never_fails_another_tenants_job(
    server: FakeServer,
) -> None:
    first_released = asyncio.Event()
    second_released = asyncio.Event()
    bob_jobs: list[str] = []

    async def gate_bob(job: TrainingJob, version: int) -> None:
        if job.tenant_id != "bob":
            return
        if not bob_jobs or bob_jobs[0] == job.job_id:
            bob_jobs[:1] = [job.job_id]
            await first_released.wait()
        else:
            bob_jobs.append(job.job_id)
            await second_released.wait()

    server.plane.training.on_step = gate_bob
    bob = _submit(server, "bob", target=50)
    server.run_until(lambda: bool(bob_jobs), what="bob's first job trains")
    server.run_until(lambda: len(_jobs(server, bob, JobState.READY)) == 1, what="bob's 2nd")
    alice = _submit(server, A, target=1)
    server.run_until(lambda: len(_jobs(server, alice, JobState.READY)) == 1, what="alice's")
    server.process.loop.call_soon(first_released.set)
    server.run_until(lambda: len(bob_jobs) == 2, what="bob's second job trains")
    (alice_job,) = _jobs(server, alice)
    assert alice_job.state is JobState.LEASED  # leased in the same group, trained after it
    assert server.run(server.master.lifecycle.cancel("bob", bob)).state is WorkloadState.CANCELLED
    server.process.loop.call_soon(second_released.set)
    done = _wait(server, alice)
    assert done.state is WorkloadState.COMPLETED
    failed = [(j.job_id, j.terminal_reason) for j in _jobs(server, alice, JobState.FAILED)]
    assert failed == [], failed


def test_aclose_stops_the_actor_even_when_a_job_turns_ready_at_that_moment(
    tmp_path: Path,
) -> None:
    srv = FakeServer(tmp_path)
    try:
        srv.sleep(0.01)  # the actor parks in async_wait_for_ready
        sched = srv.plane.scheduler

        async def ready_then_close() -> None:
            job = sched.reserve(
                policy_key="x/sft",
                domain="vla",
                tenant_id="x",
                task_type=TaskType.SFT,
                sample_count=1,
                producer_role="sft",
                consumer_role="actor",
            )
            assert job is not None
            sched.mark(job.job_id, JobState.READY, lease_epoch=job.lease_epoch)  # wakes it
            await srv.master.aclose()  # ... in the iteration its task is cancelled

        srv.process.run_or_report(ready_then_close(), timeout_s=2)
    finally:
        srv.process.kill(srv.plane, srv.master)


def test_a_cancelled_wait_for_ready_raises_even_when_a_job_turns_ready() -> None:
    from joynexus.control.scheduler import TrainingScheduler

    async def main() -> object:
        sched = TrainingScheduler.in_memory()
        waiting = asyncio.ensure_future(sched.async_wait_for_ready("actor", ["vla"], 5.0))
        await asyncio.sleep(0.01)  # parked
        job = sched.reserve(
            policy_key="x/sft",
            domain="vla",
            tenant_id="x",
            task_type=TaskType.SFT,
            sample_count=1,
            producer_role="sft",
            consumer_role="actor",
        )
        assert job is not None
        sched.mark(job.job_id, JobState.READY, lease_epoch=job.lease_epoch)  # resolves it
        waiting.cancel()  # ... and cancels it, in the same iteration
        try:
            return await waiting
        except asyncio.CancelledError:
            return "cancelled"
        finally:
            sched.close()

    assert asyncio.run(main()) == "cancelled"
