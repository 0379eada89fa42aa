"""The workload lifecycle as a Hypothesis state machine, on the fake execution plane.

Rules submit, pause, resume, cancel, advance time, run a workload to its end, end live
workloads (``fail_live``) and restart the Master — ``kill -9`` or a clean close — on the
same durable store and scheduler database. Every call's legality is decided from the
state the Master had at the moment of the call (read in the same coroutine, with no
suspension in between), and legal calls must succeed, illegal ones raise the
documented error. Invariants, after every step:

* states only follow the allowed transitions: terminal states never change, only a
  restart brings a workload back to ``starting``, ``paused`` only while the tenant has
  it paused (also across restarts), ``running`` never while paused, ``completed`` only
  at the completion target, ``cancelled`` / ``failed`` only when asked for;
* a restart never loses a workload;
* ``jobs_completed`` never decreases and never exceeds the target;
* per tenant, the served and the checkpointed policy versions never go back;
* each job completes at most once: it was trained to completion in exactly one
  process, its update is in the tenant's latest checkpoint, and no update is in the
  weights twice.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from joynexus.api import WorkloadState, WorkloadStatus
from joynexus.control.job import JobState, TaskType
from joynexus.errors import ConflictError, JoyNexusError, NotFoundError, PermissionDeniedError
from tests.fakes.plane import FakeServer, checkpointed_state, rl_spec

TENANTS = ("alice", "bob")
S = WorkloadState
#: True: a restart lets recovery finish (no workload left ``starting``) before the next
#: step. False (the default) also explores restarts during recovery (a paused workload
#: restarted again while still being recovered must stay paused).
SETTLE_AFTER_RESTART = False
#: Bundle entries of refused submits start with this.
REFUSED = "refused-"


@dataclass
class Tracked:
    """What the machine knows of one workload."""

    tenant: str
    target: int
    state: WorkloadState = S.STARTING
    jobs_completed: int = 0
    finished_at: float | None = None
    error: str | None = None
    #: The tenant paused it and has not resumed it.
    paused: bool = False
    #: A cancel / fail_live ended it (or may have: it was live when asked).
    cancel_asked: bool = False
    fail_reason: str | None = None
    #: A restart happened since the state was last observed.
    restarted: bool = False


def _explained(check: Callable[[LifecycleMachine], None]) -> Callable[[LifecycleMachine], None]:
    """An invariant whose failure lists the steps that ran (a timing-dependent failure
    may not replay, and then Hypothesis cannot print them)."""

    @functools.wraps(check)
    def checked(machine: LifecycleMachine) -> None:
        try:
            check(machine)
        except AssertionError as error:
            steps = "\n  ".join(machine.history)
            raise AssertionError(f"{error}\nsteps:\n  {steps}") from error

    return checked


class LifecycleMachine(RuleBasedStateMachine):
    workloads = Bundle("workloads")

    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory(prefix="joynexus-machine-")
        self.srv = FakeServer(Path(self._tmp.name) / "run", poll_s=0.002)
        # A clean restart must never hang: FakeServer fails the step if aclose does.
        self.srv.plane.inference.rollout_delay_s = 0.001
        self.tracked: dict[str, Tracked] = {}
        self.max_served: dict[str, int] = {}
        #: The highest version served by the processes before this one.
        self.served_before: dict[str, int] = {}
        self.max_checkpoint: dict[str, int] = {}
        #: Job ids each process trained to the end, per process.
        self.trained: list[list[str]] = []
        self.submits = 0
        #: The steps so far (a timing-dependent failure may not replay: it says what ran).
        self.history: list[str] = []

    def teardown(self) -> None:
        try:
            self.srv.close()
        finally:
            self._tmp.cleanup()

    # ----------------------------------------------------------------- helpers

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.srv.run(coro, timeout_s=20)

    def _status(self, wid: str) -> WorkloadStatus:
        return self.srv.master.reporter.status(self.tracked[wid].tenant, wid)

    def _call(
        self, wid: str, op: Callable[[str, str], Coroutine[Any, Any, WorkloadStatus]]
    ) -> tuple[WorkloadState, WorkloadStatus | None, JoyNexusError | None]:
        """``op(tenant, wid)`` with the state it met (read right before, same task)."""
        tenant = self.tracked[wid].tenant

        async def call() -> tuple[WorkloadState, WorkloadStatus | None, JoyNexusError | None]:
            before = self.srv.master.reporter.status(tenant, wid).state
            try:
                return before, await op(tenant, wid), None
            except JoyNexusError as error:
                return before, None, error

        out: tuple[WorkloadState, WorkloadStatus | None, JoyNexusError | None]
        out = self._run(call())
        return out

    # ------------------------------------------------------------------- rules

    @initialize(target=workloads, target_jobs=st.integers(1, 3))
    def first_submit(self, target_jobs: int) -> Any:
        return self.submit(TENANTS[0], target_jobs)

    @rule(target=workloads, tenant=st.sampled_from(TENANTS), target_jobs=st.integers(1, 3))
    def submit(self, tenant: str, target_jobs: int) -> Any:
        self.history.append(f"submit(tenant={tenant!r}, target_jobs={target_jobs!r})")
        master = self.srv.master
        mine = [w for w, t in self.tracked.items() if t.tenant == tenant]

        async def call() -> tuple[WorkloadStatus | None, JoyNexusError | None, list[str]]:
            try:
                st_ = await master.lifecycle.submit(rl_spec(tenant, target=target_jobs), tenant)
                error = None
            except JoyNexusError as exc:
                st_, error = None, exc
            # submit decided after its last suspension: these are the states it saw.
            live = [w for w in mine if not master.reporter.status(tenant, w).state.is_terminal]
            return st_, error, live

        status, error, live = self._run(call())
        self.submits += 1
        if live:  # one trainable workload per tenant
            assert isinstance(error, ConflictError), (live, status, error)
            # Every submit adds one entry, so what Hypothesis draws never depends on
            # timing; rules given a refused submit do nothing.
            return f"{REFUSED}{self.submits}"
        assert error is None, error
        assert status is not None and status.state is S.STARTING
        assert status.jobs_target == target_jobs and status.jobs_completed == 0
        self.tracked[status.workload_id] = Tracked(tenant, target_jobs)
        return status.workload_id

    @rule(wid=workloads)
    def pause(self, wid: str) -> None:
        self.history.append(f"pause(wid={wid!r})")
        if wid.startswith(REFUSED):
            return
        before, status, error = self._call(wid, self.srv.master.lifecycle.pause)
        if before is S.RUNNING:
            assert error is None, error
            assert status is not None and status.state is S.PAUSED
            self.tracked[wid].paused = True
        else:
            assert isinstance(error, ConflictError), (before, status)

    @rule(wid=workloads)
    def resume(self, wid: str) -> None:
        self.history.append(f"resume(wid={wid!r})")
        if wid.startswith(REFUSED):
            return
        before, status, error = self._call(wid, self.srv.master.lifecycle.resume)
        if before is S.PAUSED:
            assert error is None, error
            assert status is not None and status.state is S.RUNNING
            self.tracked[wid].paused = False
        else:
            assert isinstance(error, ConflictError), (before, status)

    @rule(wid=workloads)
    def cancel(self, wid: str) -> None:
        self.history.append(f"cancel(wid={wid!r})")
        if wid.startswith(REFUSED):
            return
        before, status, error = self._call(wid, self.srv.master.lifecycle.cancel)
        assert error is None, error
        assert status is not None
        if before.is_terminal:
            assert status.state is before  # a finished workload is left as it is
        else:
            assert status.state is S.CANCELLED
            self.tracked[wid].cancel_asked = True

    @rule(wid=workloads, other=st.sampled_from(TENANTS))
    def other_tenants_are_refused(self, wid: str, other: str) -> None:
        self.history.append(f"other_tenants_are_refused(wid={wid!r}, other={other!r})")
        if wid.startswith(REFUSED):
            return
        if other == self.tracked[wid].tenant:
            other = "mallory"
        master = self.srv.master
        # Another tenant's workload answers like an unknown one (ids are no oracle).
        for tenant, workload in ((other, wid), (self.tracked[wid].tenant, "wl-0-unknown")):
            for op in (master.lifecycle.pause, master.lifecycle.resume, master.lifecycle.cancel):
                try:
                    self._run(op(tenant, workload))
                except NotFoundError:
                    continue
                raise AssertionError(f"{op.__name__}({tenant!r}, {workload!r}) was not refused")
        try:
            self._run(master.lifecycle.submit(rl_spec(self.tracked[wid].tenant), other))
        except PermissionDeniedError:
            pass
        else:
            raise AssertionError(f"{other} submitted a workload for another tenant")

    @rule(ms=st.sampled_from([0, 3, 15]))
    def advance(self, ms: int) -> None:
        self.history.append(f"advance(ms={ms!r})")
        self.srv.sleep(ms / 1000)

    @rule(wid=workloads)
    def run_to_end(self, wid: str) -> None:
        self.history.append(f"run_to_end(wid={wid!r})")
        t = self.tracked.get(wid)
        if t is None or t.paused:
            return
        self.srv.run_until(
            lambda: self._status(wid).state.is_terminal, timeout_s=15, what=f"{wid} ends"
        )
        now = self._status(wid)
        if not (t.cancel_asked or t.fail_reason):
            assert now.state is S.COMPLETED, now
            assert now.jobs_completed == t.target

    @rule()
    def fail_live(self) -> None:
        self.history.append("fail_live()")
        reason = "role 'training': recovery budget spent"
        master = self.srv.master

        async def call() -> tuple[list[str], list[str]]:
            live = [w for w, t in self.tracked.items() if not self._status(w).state.is_terminal]
            return live, await master.supervisor.fail_live(reason)

        live, ended = self._run(call())
        assert sorted(ended) == sorted(live)
        for wid in ended:
            self.tracked[wid].fail_reason = reason
            st_ = self._status(wid)
            assert st_.state is S.FAILED and st_.error == reason

    @rule(kill=st.booleans())
    def restart(self, kill: bool) -> None:
        self.history.append(f"restart(kill={kill!r})")
        old = self.srv.plane.training
        self.served_before = dict(self.max_served)
        self.srv.restart(kill=kill)
        self.trained.append([j for _, j, _ in old.trained])  # all the old process did
        for t in self.tracked.values():
            t.restarted = True
        if SETTLE_AFTER_RESTART:
            self.srv.run_until(
                lambda: all(self._status(w).state is not S.STARTING for w in self.tracked),
                timeout_s=15,
                what="recovery",
            )

    # -------------------------------------------------------------- invariants

    @invariant()
    @_explained
    def nothing_is_lost(self) -> None:
        ids = set(self.srv.master.reporter.workload_ids())
        assert set(self.tracked) <= ids, set(self.tracked) - ids
        stored = {r.workload_id for r in self.srv.plane.store.load()}
        assert set(self.tracked) <= stored

    @invariant()
    @_explained
    def states_follow_the_allowed_transitions(self) -> None:
        for wid, t in self.tracked.items():
            now = self._status(wid)
            last = t.state
            where = f"{wid}: {last.value} -> {now.state.value} ({t})"
            if last.is_terminal:
                assert now.state is last, where
                assert (now.finished_at, now.error) == (t.finished_at, t.error), where
            elif now.state is S.STARTING:
                assert last is S.STARTING or t.restarted, where
            elif now.state is S.PAUSED:
                assert t.paused, where
            elif now.state is S.RUNNING:
                assert not t.paused, where
            elif now.state is S.COMPLETED:
                assert now.jobs_completed == t.target, where
            elif now.state is S.CANCELLED:
                assert t.cancel_asked, where
            elif now.state is S.FAILED:
                assert t.fail_reason is not None and now.error == t.fail_reason, where
            # progress
            assert now.jobs_target == t.target, where
            assert t.jobs_completed <= now.jobs_completed <= t.target, where
            t.state, t.jobs_completed, t.restarted = now.state, now.jobs_completed, False
            t.finished_at, t.error = now.finished_at, now.error

    @invariant()
    @_explained
    def policy_versions_never_go_back(self) -> None:
        plane = self.srv.plane
        for tenant in TENANTS:
            served = plane.inference.published.get(tenant, [])
            assert served == sorted(served), (tenant, served)  # within this process
            if served:  # ... and across processes
                assert served[0] >= self.served_before.get(tenant, 0), (tenant, served)
                self.max_served[tenant] = served[-1]
            ck = checkpointed_state(plane.output_root, tenant)
            if ck is not None:
                assert ck["version"] >= self.max_checkpoint.get(tenant, 0), tenant
                self.max_checkpoint[tenant] = ck["version"]
                # What is served was checkpointed first.
                assert self.max_served.get(tenant, 0) <= ck["version"], tenant

    @invariant()
    @_explained
    def each_job_completes_at_most_once(self) -> None:
        plane = self.srv.plane
        trained = [*self.trained, [j for _, j, _ in plane.training.trained]]
        for tenant in TENANTS:
            done = [
                j.job_id
                for j in plane.scheduler.list_jobs(tenant_id=tenant, state=JobState.COMPLETED)
                if j.task_type is TaskType.RL
            ]
            assert len(done) == len(set(done))
            for job_id in done:
                runs = sum(gen.count(job_id) for gen in trained)
                assert runs == 1, f"completed job {job_id} was trained {runs} times"
            ck = checkpointed_state(plane.output_root, tenant)
            applied = [] if ck is None else ck["applied"]
            assert len(applied) == len(set(applied)), f"{tenant}: an update applied twice"
            missing = set(done) - set(applied)
            assert not missing, f"{tenant}: completed jobs not in the weights: {missing}"


LifecycleMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLifecycle = LifecycleMachine.TestCase
