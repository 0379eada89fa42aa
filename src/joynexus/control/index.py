"""The Training Scheduler's in-memory indexes over job records.

Everything the scheduler must answer without scanning all jobs lives here: jobs by
state and by tenant (queries, counters), admission counts, one priority queue per
``(state, consumer_role, domain)`` for the stages and the actor to lease from, and a
heap of lease deadlines. Every state change goes through :meth:`JobIndex.move`, so
the indexes cannot drift apart. Not thread-safe: the scheduler's lock guards it.

Queues and the deadline heap use lazy deletion: a job that leaves a queue, or a lease
that ends, leaves its heap entry behind, and the entry is discarded when it reaches
the top (queues check a per-job token; deadlines check the lease epoch).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from heapq import heapify, heappop, heappush
from typing import Any

from joynexus.control.admission import AdmissionCounts
from joynexus.control.job import TERMINAL_STATES, JobState, JobTally, TaskType
from joynexus.control.store import JobRecord
from joynexus.utils.clock import Clock

_R = JobState.RESERVED
_LIVE_STATES = tuple(s for s in JobState if s not in TERMINAL_STATES)
# Queue entry: (-priority, order, token, job_id); ``order`` is ready_seq for ``ready``
# (the paper's FIFO) and created_seq for the stage queues.
_Entry = tuple[int, int, int, str]
QueueKey = tuple[JobState, str, str]


class JobIndex:
    """Indexes over every job record the scheduler knows (terminal ones included)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.jobs: dict[str, JobRecord] = {}
        self.by_state: dict[JobState, dict[str, None]] = {s: {} for s in JobState}
        self.by_tenant: dict[str, dict[str, None]] = {}
        self.tenant_counts: dict[str, dict[JobState, int]] = {}
        self.counts = AdmissionCounts()
        self.live_partitions: set[str] = set()
        self._queues: dict[QueueKey, list[_Entry]] = {}
        self._queued: dict[str, int] = {}
        self._tokens = 0
        self._deadlines: list[tuple[float, int, str]] = []

    # ------------------------------------------------------------- bookkeeping

    def add(self, rec: JobRecord) -> None:
        """Index a new (or recovered) record; a live producer lease counts as active."""
        self.jobs[rec.job_id] = rec
        self.by_state[rec.state][rec.job_id] = None
        self.by_tenant.setdefault(rec.tenant_id, {})[rec.job_id] = None
        counts = self.tenant_counts.get(rec.tenant_id)
        if counts is None:
            counts = self.tenant_counts[rec.tenant_id] = dict.fromkeys(JobState, 0)
        counts[rec.state] += 1
        key = (rec.tenant_id, rec.task_type)
        if rec.state is JobState.COMPLETED:
            self.counts.completed[key] = self.counts.completed.get(key, 0) + 1
        if rec.state not in TERMINAL_STATES:
            self.counts.in_flight[key] = self.counts.in_flight.get(key, 0) + 1
            self.live_partitions.add(rec.partition_id)
        if rec.state is _R and rec.lease_expires_at is not None:
            self.add_active(rec, 1)

    def add_active(self, rec: JobRecord, delta: int) -> None:
        """Count a job in or out of *active* (reserved, producer lease still held)."""
        self.counts.add_active(rec.tenant_id, rec.task_type, rec.producer_role, delta)

    def move(self, rec: JobRecord, new: JobState) -> None:
        """Change state, keeping every index in step; ends any lease the job held."""
        old = rec.state
        if old is _R and rec.lease_expires_at is not None:
            self.add_active(rec, -1)
        del self.by_state[old][rec.job_id]
        self.by_state[new][rec.job_id] = None
        counts = self.tenant_counts[rec.tenant_id]
        counts[old] -= 1
        counts[new] += 1
        self._queued.pop(rec.job_id, None)
        rec.state = new
        rec.lease_expires_at = None
        rec.updated_at = self.clock.wall()

    def finish(self, rec: JobRecord, state: JobState, reason: str) -> None:
        """Move to a terminal state and release the job's admission slot and partition."""
        self.move(rec, state)
        rec.terminal_reason = reason
        rec.finished_at = rec.updated_at
        key = (rec.tenant_id, rec.task_type)
        self.counts.in_flight[key] -= 1
        if state is JobState.COMPLETED:
            self.counts.completed[key] = self.counts.completed.get(key, 0) + 1
        self.live_partitions.discard(rec.partition_id)

    # ------------------------------------------------------------------ queues

    def enqueue(self, rec: JobRecord) -> bool:
        """Make a job leasable if it waits in a state someone leases from.

        Returns True when the job became ``ready`` (waiters should be woken).
        """
        state = rec.state
        if state is JobState.READY:
            order = rec.ready_seq or 0
        elif state is JobState.NEEDS_ADVANTAGES or (
            state is _R and rec.lease_expires_at is None and rec.task_type is TaskType.RL
        ):
            order = rec.created_seq
        else:
            return False
        self._tokens += 1
        self._queued[rec.job_id] = self._tokens
        key = (state, rec.consumer_role, rec.domain)
        heap = self._queues.get(key)
        if heap is None:
            heap = self._queues[key] = []
        heappush(heap, (-rec.priority, order, self._tokens, rec.job_id))
        return state is JobState.READY

    def _clean_top(self, heap: list[_Entry]) -> bool:
        """Drop stale entries off the top; True if a live entry remains."""
        queued = self._queued
        while heap:
            entry = heap[0]
            if queued.get(entry[3]) == entry[2]:
                return True
            heappop(heap)
        return False

    def pop(self, key: QueueKey) -> JobRecord | None:
        """Take the best job waiting under ``key``, or None."""
        heap = self._queues.get(key)
        if not heap or not self._clean_top(heap):
            return None
        job_id = heappop(heap)[3]
        del self._queued[job_id]
        return self.jobs[job_id]

    def pop_ready(self, consumer_role: str, domains: Sequence[str]) -> JobRecord | None:
        """Take the best ``ready`` job across ``domains``: priority, then ready_seq."""
        best: QueueKey | None = None
        best_entry: _Entry | None = None
        for dom in domains:
            key = (JobState.READY, consumer_role, dom)
            heap = self._queues.get(key)
            if heap and self._clean_top(heap) and (best_entry is None or heap[0] < best_entry):
                best, best_entry = key, heap[0]
        return None if best is None else self.pop(best)

    def has_ready(self, consumer_role: str, domains: Sequence[str]) -> bool:
        for dom in domains:
            heap = self._queues.get((JobState.READY, consumer_role, dom))
            if heap and self._clean_top(heap):
                return True
        return False

    # --------------------------------------------------------------- deadlines

    def track_lease(self, rec: JobRecord) -> None:
        """Watch the deadline of the lease a job has just been granted."""
        assert rec.lease_expires_at is not None
        heap = self._deadlines
        heappush(heap, (rec.lease_expires_at, rec.lease_epoch, rec.job_id))
        # Ended leases leave their entry behind until its deadline passes; at high
        # rates that is many entries per live lease, so compact now and then.
        if len(heap) > 1024 and len(heap) > 4 * self.live_count():
            self._deadlines = [
                (r.lease_expires_at, r.lease_epoch, r.job_id)
                for state in _LIVE_STATES
                for r in (self.jobs[i] for i in self.by_state[state])
                if r.lease_expires_at is not None
            ]
            heapify(self._deadlines)

    def live_count(self) -> int:
        return sum(len(self.by_state[s]) for s in _LIVE_STATES)

    def next_deadline(self) -> float | None:
        return self._deadlines[0][0] if self._deadlines else None

    def due_leases(self, now: float) -> list[JobRecord]:
        """Jobs whose live lease expired at or before ``now`` (their state untouched)."""
        heap = self._deadlines
        due: list[JobRecord] = []
        while heap and heap[0][0] <= now:
            _, epoch, job_id = heappop(heap)
            rec = self.jobs[job_id]
            if rec.lease_epoch != epoch or rec.lease_expires_at is None:
                continue  # that lease already ended or was superseded
            if rec.lease_expires_at > now:  # heartbeated since: track the new deadline
                heappush(heap, (rec.lease_expires_at, epoch, job_id))
                continue
            due.append(rec)
        return due

    # ----------------------------------------------------------------- queries

    def select(self, tenant_id: str | None, state: JobState | None) -> list[JobRecord]:
        """Records filtered by tenant and state, oldest (created_seq) first."""
        ids: Iterable[str]
        if tenant_id is not None:
            ids = self.by_tenant.get(tenant_id, {})
            if state is not None:
                ids = [i for i in ids if self.jobs[i].state is state]
        elif state is not None:
            ids = self.by_state[state]
        else:
            ids = self.jobs
        return sorted((self.jobs[i] for i in ids), key=lambda r: r.created_seq)

    def counters(self) -> dict[str, Any]:
        return {
            "total": len(self.jobs),
            "by_state": {s.value: len(self.by_state[s]) for s in JobState},
            "by_tenant": {
                tenant: {s.value: n for s, n in counts.items()}
                for tenant, counts in self.tenant_counts.items()
            },
        }

    def tally(self, tenant_id: str, workload_id: str | None) -> JobTally:
        """Counts over the tenant's records (those of ``workload_id`` when given)."""
        failed: dict[str | None, int] = {}
        total = terminal = completed = dropped = 0
        span = 0.0
        for job_id in self.by_tenant.get(tenant_id, {}):
            rec = self.jobs[job_id]
            if workload_id is not None and rec.metadata.get("workload_id") != workload_id:
                continue
            total += 1
            if rec.state in TERMINAL_STATES:
                terminal += 1
            if rec.state is JobState.COMPLETED:
                completed += 1
                if rec.finished_at is not None:
                    span += rec.finished_at - rec.created_at
            elif rec.state is JobState.FAILED:
                failed[rec.terminal_reason] = failed.get(rec.terminal_reason, 0) + 1
            elif rec.state is JobState.DROPPED:
                dropped += 1
        return JobTally(total, terminal, completed, dropped, failed, span)
