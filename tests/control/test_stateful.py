"""A Hypothesis state machine over the scheduler, with crashes and reopen from SQLite.

Invariants checked after every step: no job is lost, no job is leased twice at once
(a grant only ever goes to a job without a live lease, and epochs only grow), every
state change is a Table 4 edge or a lease return, and counters agree with list_jobs.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from joynexus.control.admission import AdmissionPolicy, GlobalLimit
from joynexus.control.job import (
    ALLOWED_TRANSITIONS,
    LEASE_RETURN,
    LEASE_STATES,
    TERMINAL_STATES,
    JobState,
    TaskType,
    TrainingJob,
)
from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import IllegalTransitionError, StaleLeaseError
from joynexus.utils.clock import FakeClock

from .test_durability import counters_from_list_jobs

S = JobState
TTL = 10.0
STAGES = {
    "actor_forward": (S.RESERVED, S.COMPUTING_ACTOR_FORWARD),
    "advantages": (S.NEEDS_ADVANTAGES, S.COMPUTING_ADVANTAGES),
}


def _fence_ok(job: TrainingJob, epoch: int | None) -> bool:
    return epoch is None or (epoch == job.lease_epoch and job.has_lease)


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="jnx-sched-"))
        self.clock = FakeClock()
        self.sched = self._open()
        self._configure()
        self.ids: set[str] = set()
        self.last: dict[str, tuple[JobState, int]] = {}
        self.held: dict[str, int] = {}

    def _configure(self) -> None:
        self.sched.set_policy("t0", "rl", AdmissionPolicy(max_in_flight=4))
        self.sched.set_policy("t1", "sft", AdmissionPolicy(priority=2))
        self.sched.set_global_limit(GlobalLimit(task_type="rl", max_active=3))

    def _open(self) -> TrainingScheduler:
        return TrainingScheduler.open(
            self.dir / "sched.db", clock=self.clock, lease_ttl_s=TTL, max_attempts=2
        )

    def teardown(self) -> None:
        self.sched.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _by_age(self, ids: Iterable[str]) -> list[str]:
        # Job ids are random tokens: order them by creation, or the same example would
        # draw different jobs from one run to the next.
        return sorted(ids, key=lambda i: self.sched.get(i).created_seq)

    def _pick(self, data: st.DataObject) -> TrainingJob:
        self.sched.expire_leases()  # so the snapshot below is what the call will see
        return self.sched.get(data.draw(st.sampled_from(self._by_age(self.ids))))

    def _epoch(self, data: st.DataObject, job: TrainingJob) -> int | None:
        choice = data.draw(st.sampled_from(["none", "current", "old"]))
        if choice == "none":
            return None
        return job.lease_epoch if choice == "current" else job.lease_epoch - 1

    def _granted(self, before: dict[str, TrainingJob], job: TrainingJob | None) -> None:
        if job is None:
            return
        prev = before[job.job_id]
        assert not prev.has_lease, f"{job.job_id} leased while its lease was live"
        assert job.lease_epoch == prev.lease_epoch + 1
        assert job.state in LEASE_STATES and job.has_lease
        self.held[job.job_id] = job.lease_epoch

    # ------------------------------------------------------------------ rules

    @rule(tenant=st.sampled_from(["t0", "t1", "t2"]), task=st.sampled_from(list(TaskType)))
    def reserve(self, tenant: str, task: TaskType) -> None:
        job = self.sched.reserve(
            policy_key=f"{tenant}/{task}",
            domain="vla",
            tenant_id=tenant,
            task_type=task,
            sample_count=4,
            producer_role="producer",
            consumer_role="actor",
            behavior_policy_version=0 if task is TaskType.RL else None,
            max_policy_staleness=1 if task is TaskType.RL else None,
            metadata={"schema_signature": "sig"},
        )
        if job is not None:
            assert job.job_id not in self.ids and job.state is S.RESERVED
            self.ids.add(job.job_id)
            self.held[job.job_id] = job.lease_epoch

    @precondition(lambda self: self.ids)
    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def produce(self, data: st.DataObject) -> None:
        """A producer finishing its job: the forward moves that make leasing possible."""
        self.sched.expire_leases()
        producing = [j for j in self.sched.list_jobs(state=S.RESERVED) if j.has_lease]
        if not producing:
            return
        job = data.draw(st.sampled_from(producing))
        if job.task_type is TaskType.SFT:
            after = self.sched.mark(job.job_id, S.READY, lease_epoch=job.lease_epoch)
        elif data.draw(st.booleans()):
            after = self.sched.mark(job.job_id, S.NEEDS_ADVANTAGES, lease_epoch=job.lease_epoch)
        else:
            after = self.sched.hand_off(job.job_id, job.lease_epoch)
        assert not after.has_lease

    @precondition(lambda self: self.ids)
    @rule(data=st.data(), any_state=st.booleans())
    def mark(self, data: st.DataObject, any_state: bool) -> None:
        before = self._pick(data)
        allowed = sorted(ALLOWED_TRANSITIONS[before.task_type][before.state])
        # mostly legal targets (so jobs make progress), sometimes any state at all
        choices = list(JobState) if any_state or not allowed else allowed
        target = data.draw(st.sampled_from(choices))
        epoch = self._epoch(data, before)
        duplicate_complete = (
            target is S.COMPLETED
            and before.state is S.COMPLETED
            and epoch in (None, before.lease_epoch)
        )
        legal = target in ALLOWED_TRANSITIONS[before.task_type][before.state]
        expect_ok = duplicate_complete or (
            legal and target not in LEASE_STATES and _fence_ok(before, epoch)
        )
        try:
            after = self.sched.mark(before.job_id, target, lease_epoch=epoch)
        except (IllegalTransitionError, StaleLeaseError):
            assert not expect_ok, f"{before.state}->{target} epoch={epoch} was refused"
            assert self.sched.get(before.job_id) == before
        else:
            assert expect_ok, f"{before.state}->{target} epoch={epoch} was accepted"
            assert after.state is target and not after.has_lease

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def hand_off(self, data: st.DataObject) -> None:
        before = self._pick(data)
        try:
            after = self.sched.hand_off(before.job_id, self._epoch(data, before))
        except (IllegalTransitionError, StaleLeaseError):
            assert self.sched.get(before.job_id) == before
        else:
            assert before.state is S.RESERVED and before.task_type is TaskType.RL
            assert after.state is S.RESERVED and not after.has_lease

    @rule(stage=st.sampled_from(sorted(STAGES)))
    def lease_stage(self, stage: str) -> None:
        src, dst = STAGES[stage]
        self.sched.expire_leases()
        before = {j.job_id: j for j in self.sched.list_jobs()}
        job = self.sched.lease_stage(src, "actor", "vla", dst)
        if job is not None:
            assert before[job.job_id].state is src
        else:
            waiting = [j for j in before.values() if j.state is src and not j.has_lease]
            assert not [j for j in waiting if j.task_type is TaskType.RL]
        self._granted(before, job)

    @rule()
    def lease_next(self) -> None:
        self.sched.expire_leases()
        before = {j.job_id: j for j in self.sched.list_jobs()}
        job = self.sched.lease_next("actor", ["vla"])
        ready = [j for j in before.values() if j.state is S.READY]
        if job is None:
            assert not ready
        else:
            best = min(ready, key=lambda j: (-j.priority, j.ready_seq or 0))
            assert job.job_id == best.job_id
        self._granted(before, job)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self._by_age(self.held)))
        self.sched.expire_leases()
        before = self.sched.get(job_id)
        epoch = self.held[job_id]
        try:
            after = self.sched.heartbeat(job_id, epoch)
        except StaleLeaseError:
            assert not (before.has_lease and before.lease_epoch == epoch)
        else:
            assert before.has_lease and before.lease_epoch == epoch
            assert after.lease_expires_at == self.clock.now() + TTL

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self._by_age(self.held)))
        self.sched.expire_leases()
        before = self.sched.get(job_id)
        epoch = self.held[job_id]
        expect_ok = (before.state is S.COMPLETED and before.lease_epoch == epoch) or (
            before.state is S.LEASED and _fence_ok(before, epoch)
        )
        try:
            after = self.sched.complete(job_id, epoch)
        except (IllegalTransitionError, StaleLeaseError):
            assert not expect_ok
        else:
            assert expect_ok and after.state is S.COMPLETED

    @precondition(lambda self: self.ids)
    @rule(data=st.data(), drop=st.booleans())
    def fail_or_drop(self, data: st.DataObject, drop: bool) -> None:
        before = self._pick(data)
        epoch = self._epoch(data, before)
        target = S.DROPPED if drop else S.FAILED
        expect_ok = target in ALLOWED_TRANSITIONS[before.task_type][before.state] and _fence_ok(
            before, epoch
        )
        call = self.sched.drop if drop else self.sched.fail
        try:
            after = call(before.job_id, "test", epoch)
        except (IllegalTransitionError, StaleLeaseError):
            assert not expect_ok
        else:
            assert expect_ok and after.state is target and after.terminal_reason == "test"

    @rule(seconds=st.sampled_from([0.5, 3.0, 9.0, 10.0, 25.0]))
    def advance_clock(self, seconds: float) -> None:
        before = {j.job_id: j for j in self.sched.list_jobs()}
        self.clock.advance(seconds)
        for job in self.sched.expire_leases():
            prev = before[job.job_id]
            assert prev.has_lease and prev.lease_expires_at is not None
            assert prev.lease_expires_at <= self.clock.now()
            if prev.state is S.RESERVED:
                assert job.terminal_reason == "producer_lost"
            elif job.state is S.FAILED:
                assert job.terminal_reason == "attempts_exhausted" and job.attempts == 2
            else:
                assert job.state is LEASE_RETURN[prev.state]
                assert job.attempts == prev.attempts + 1

    @rule()
    def crash_and_reopen(self) -> None:
        before = {
            j.job_id: j.model_dump(exclude={"lease_expires_at"}) for j in self.sched.list_jobs()
        }
        dead = self.sched
        self.sched = self._open()  # the dead process never got to shut down cleanly
        dead.close()
        self._configure()
        after = {
            j.job_id: j.model_dump(exclude={"lease_expires_at"}) for j in self.sched.list_jobs()
        }
        assert after == before

    # ------------------------------------------------------------- invariants

    @invariant()
    def nothing_lost_and_counters_consistent(self) -> None:
        jobs = self.sched.list_jobs()
        assert {j.job_id for j in jobs} == self.ids
        assert self.sched.counters() == counters_from_list_jobs(self.sched)

    @invariant()
    def only_legal_moves_and_one_lease(self) -> None:
        for job in self.sched.list_jobs():
            prev_state, prev_epoch = self.last.get(job.job_id, (S.RESERVED, 1))
            assert job.lease_epoch >= prev_epoch
            if job.state is not prev_state:
                legal = job.state in ALLOWED_TRANSITIONS[job.task_type][prev_state]
                returned = LEASE_RETURN.get(prev_state) is job.state
                assert legal or returned, f"{job.job_id}: {prev_state} -> {job.state}"
            if job.state in LEASE_STATES:
                assert job.has_lease
            if job.state in TERMINAL_STATES:
                assert not job.has_lease
            self.last[job.job_id] = (job.state, job.lease_epoch)


SchedulerMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSchedulerStateMachine = SchedulerMachine.TestCase
