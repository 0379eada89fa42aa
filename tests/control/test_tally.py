"""``TrainingScheduler.tally``: the counts the Master polls, equal to list_jobs'."""

from __future__ import annotations

from joynexus.control.job import JobState
from joynexus.control.scheduler import TrainingScheduler
from joynexus.utils.clock import FakeClock

from .conftest import make_ready, reserve


def test_tally_equals_the_counts_of_list_jobs(sched: TrainingScheduler, clock: FakeClock) -> None:
    sig = {"schema_signature": "sig-a"}
    a = [reserve(sched, metadata={**sig, "workload_id": "w-a"}) for _ in range(4)]
    b = reserve(sched, metadata={**sig, "workload_id": "w-b"})
    # a[0] completes after 3 s, a[1] fails twice over (crash, cancelled), a[2] is in flight.
    make_ready(sched, a[0])
    clock.advance(3.0)
    lease = sched.lease_next("actor", "vla")
    assert lease is not None and lease.job_id == a[0].job_id
    sched.complete(lease.job_id, lease.lease_epoch)
    sched.fail(a[1].job_id, "crash")
    sched.fail(a[3].job_id, "cancelled")
    sched.fail(b.job_id, "crash")

    tally = sched.tally("t1", "w-a")
    jobs = [j for j in sched.list_jobs("t1") if j.metadata.get("workload_id") == "w-a"]
    assert tally.total == len(jobs) == 4
    assert tally.completed == sum(j.state is JobState.COMPLETED for j in jobs) == 1
    assert tally.in_flight == sum(not j.is_terminal for j in jobs) == 1
    assert tally.terminal == 3 and tally.dropped == 0
    assert tally.failed_by_reason == {"crash": 1, "cancelled": 1}
    assert tally.failed_except(("cancelled",)) == 1
    assert tally.completed_span_s == 3.0
    # Without a workload: every job of the tenant; another tenant's: none.
    assert sched.tally("t1").total == 5 and sched.tally("t1").failed_by_reason == {
        "crash": 2,
        "cancelled": 1,
    }
    assert sched.tally("t2").total == 0
