"""Lease rules of training jobs: fencing and expiry (see :mod:`joynexus.control.scheduler`).

A call that names a ``lease_epoch`` other than the job's current, live one raises
:class:`StaleLeaseError`, so a worker that lost its lease cannot overwrite the work of
its successor. An expired producer lease fails its job; an expired stage or consumer
lease returns the job to the state it was leased from, until its attempts run out.
The caller holds the scheduler's lock.
"""

from __future__ import annotations

from joynexus.control.index import JobIndex
from joynexus.control.job import LEASE_RETURN, JobState
from joynexus.control.store import JobRecord
from joynexus.errors import StaleLeaseError

REASON_PRODUCER_LOST = "producer_lost"
REASON_ATTEMPTS_EXHAUSTED = "attempts_exhausted"


def stale_lease(rec: JobRecord, lease_epoch: int | None) -> StaleLeaseError:
    """The error for a call on ``rec`` under the dead lease ``lease_epoch``."""
    held = (
        f"live lease epoch {rec.lease_epoch}"
        if rec.lease_expires_at is not None
        else "no live lease (it expired, ended, or was never granted)"
    )
    return StaleLeaseError(
        f"training job {rec.job_id!r} (state {rec.state.value!r}) has {held}; "
        f"lease epoch {lease_epoch} is no longer valid",
        job_id=rec.job_id,
        lease_epoch=lease_epoch,
        current_epoch=rec.lease_epoch,
        state=rec.state.value,
    )


def fence(rec: JobRecord, lease_epoch: int | None) -> None:
    """Raise unless ``lease_epoch`` is None (trusted) or the job's live lease."""
    if lease_epoch is not None and (lease_epoch != rec.lease_epoch or rec.lease_expires_at is None):
        raise stale_lease(rec, lease_epoch)


def expire_due(ix: JobIndex, now: float, max_attempts: int) -> tuple[list[JobRecord], bool]:
    """Expire the leases of ``ix`` due by ``now``: the jobs changed, and whether any of
    them now waits in a queue (its waiters must be woken)."""
    deadline = ix.next_deadline()
    if deadline is None or deadline > now:
        return [], False
    changed = ix.due_leases(now)
    queued = False
    for rec in changed:
        if rec.state is JobState.RESERVED:
            ix.finish(rec, JobState.FAILED, REASON_PRODUCER_LOST)
            continue
        rec.attempts += 1
        if rec.attempts >= max_attempts:
            ix.finish(rec, JobState.FAILED, REASON_ATTEMPTS_EXHAUSTED)
        else:
            ix.move(rec, LEASE_RETURN[rec.state])
            queued = ix.enqueue(rec) or queued
    return changed, queued
