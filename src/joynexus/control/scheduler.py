"""The Training Scheduler (paper §4.3, Appendix A.2, A.4–A.6).

It owns the control state of every training job — never its data — and answers four
questions: may this producer start a job (admission), which job should this worker
process next (``lease_stage`` / ``lease_next``), is the worker that holds a job still
alive (leases and heartbeats), and is an RL job too stale to train on (Eq. (1)).

Leases. Every grant bumps the job's ``lease_epoch`` and sets ``lease_expires_at`` to
``clock.now() + ttl``; ``heartbeat`` pushes the deadline forward. Calls that pass a
``lease_epoch`` are fenced: an epoch other than the job's current, live one raises
:class:`StaleLeaseError`, so a worker that lost its lease cannot overwrite the work of
its successor. Calls without an epoch are trusted (the paper's pseudocode passes none).

* ``reserve`` grants the *producer* a lease (epoch 1). If the producer stops
  heartbeating before it marks the job, the job fails with ``producer_lost``: its
  partition may be partially written, so it is not handed to anyone else. Producers
  of long rollouts therefore heartbeat (``producer_lease_ttl_s`` sets their TTL).
* A stage lease (``computing_actor_forward``, ``computing_advantages``) or consumer
  lease (``leased``) that expires sends the job back to the state it was leased from
  with ``attempts + 1``; once ``attempts`` reaches ``max_attempts`` the job fails with
  ``attempts_exhausted`` instead: with ``max_attempts=3`` a job survives two expired
  leases and fails at the third.
* Expiry runs lazily at the start of every lease, mark, heartbeat and terminal call
  (a heap peek), and on demand through ``expire_leases``.

The optional actor-forward stage has no waiting state of its own in Table 4; a
producer ends production with ``hand_off`` and the job waits in ``reserved`` without a
lease (see :mod:`joynexus.control.job` for the full reasoning).

Durability. Every transition is written through the :class:`JobStore` inside the
scheduler's lock, in one transaction, before the call returns. Heartbeats are not
written: ``lease_expires_at`` lives on this process's monotonic clock, which means
nothing to the next process. A scheduler that opens an existing database recovers
every job and both sequence counters, and gives each recovered lease one fresh TTL
from the moment of recovery: holders that are still alive keep it by heartbeating,
the leases of a dead process expire and their jobs are leased again.

Admission policies and global limits are configuration, not state: they are not
stored, and whoever builds the scheduler sets them again after a restart.

Concurrency. One lock guards all state. ``wait_for_ready`` parks threads on a
condition of that lock; ``async_wait_for_ready`` parks a future that a transition to
``ready`` resolves thread-safely, so it never blocks the event loop while it waits.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from joynexus.control.admission import Admission, AdmissionPolicy, GlobalLimit
from joynexus.control.index import JobIndex
from joynexus.control.job import (
    TERMINAL_STATES,
    JobState,
    JobTally,
    TaskType,
    TrainingJob,
    check_hand_off,
    check_mark_target,
    check_recoverable,
    check_reserve_counts,
    check_stage_lease,
    check_transition,
    derive_partition_id,
    metadata_json,
    parse_state,
    parse_task_type,
)
from joynexus.control.job import is_stale as _is_stale
from joynexus.control.leases import expire_due, fence, stale_lease
from joynexus.control.store import InMemoryJobStore, JobRecord, JobStore, SQLiteJobStore
from joynexus.control.waiting import ReadyWaiters, async_wait_until, wait_until
from joynexus.errors import ConflictError, InternalError, InvalidRequestError, unknown_id
from joynexus.utils.clock import Clock, SystemClock
from joynexus.utils.ids import random_id
from joynexus.utils.storage import as_storage_full

REASON_COMPLETED = "completed"

#: Backstop on a job's stored metadata (serialized JSON); the HTTP API's own limit
#: (``ServerConfig.max_job_metadata_bytes``, 64 KiB) is tighter.
DEFAULT_MAX_METADATA_BYTES = 1 << 20

_R = JobState.RESERVED


class TrainingScheduler:
    """Control state, admission and leases of training jobs.

    Args:
        store: Where jobs are persisted; its jobs are recovered on construction.
        clock: Time source for leases (defaults to the system clock).
        lease_ttl_s: Lifetime of a stage or consumer lease between heartbeats.
        max_attempts: Tries a job gets before an expired lease fails it.
        producer_lease_ttl_s: Lifetime of a producer's lease on a ``reserved`` job
            between heartbeats (defaults to ``lease_ttl_s``).
        max_metadata_bytes: Longest metadata a job stores (serialized JSON, after a
            ``complete`` merges into it); None: unbounded.
        turn_ttl_s: A tenant refused by a full global bound keeps its turn (see
            :mod:`joynexus.control.admission`) while it asks again within this time.
    """

    def __init__(
        self,
        store: JobStore,
        *,
        clock: Clock | None = None,
        lease_ttl_s: float = 60.0,
        max_attempts: int = 3,
        producer_lease_ttl_s: float | None = None,
        max_metadata_bytes: int | None = DEFAULT_MAX_METADATA_BYTES,
        turn_ttl_s: float = 10.0,
    ) -> None:
        if lease_ttl_s <= 0:
            raise InvalidRequestError(f"lease_ttl_s must be > 0, got {lease_ttl_s}")
        if max_attempts < 1:
            raise InvalidRequestError(f"max_attempts must be >= 1, got {max_attempts}")
        if producer_lease_ttl_s is not None and producer_lease_ttl_s <= 0:
            raise InvalidRequestError(
                f"producer_lease_ttl_s must be > 0, got {producer_lease_ttl_s}"
            )
        self._store = store
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.lease_ttl_s = float(lease_ttl_s)
        self.producer_lease_ttl_s = float(producer_lease_ttl_s or lease_ttl_s)
        self.max_attempts = int(max_attempts)
        self.max_metadata_bytes = max_metadata_bytes
        self._lock = threading.Lock()
        self._waiters = ReadyWaiters(self._lock)
        self._admission = Admission(turn_ttl_s)
        self._closed = False
        with self._lock:
            self._rebuild()

    # ----------------------------------------------------------------- construction

    @classmethod
    def in_memory(cls, **kw: Any) -> TrainingScheduler:
        """A scheduler whose jobs live only in this process (tests, benchmarks)."""
        return cls(InMemoryJobStore(), **kw)

    @classmethod
    def open(cls, path: str | Path, **kw: Any) -> TrainingScheduler:
        """A durable scheduler on the SQLite file ``path``, recovering every job in it."""
        return cls(SQLiteJobStore(path), **kw)

    def _rebuild(self) -> None:
        """(Re)build every index from the store: on start, and after a failed write."""
        self._ix = JobIndex(self._clock)
        self._created_seq = 0
        self._ready_seq = 0
        now = self._clock.now()
        for rec in sorted(self._store.load(), key=lambda r: r.created_seq):
            self._created_seq = max(self._created_seq, rec.created_seq)
            self._ready_seq = max(self._ready_seq, rec.ready_seq or 0)
            if rec.state not in TERMINAL_STATES and rec.lease_expires_at is not None:
                rec.lease_expires_at = now + self._ttl(rec)
            self._ix.add(rec)
            if rec.lease_expires_at is not None:
                self._ix.track_lease(rec)
            elif rec.state not in TERMINAL_STATES:
                self._enqueue(rec)

    # ------------------------------------------------------------------- admission

    def set_policy(
        self, tenant_id: str, task_type: TaskType | str, policy: AdmissionPolicy
    ) -> None:
        """Set the admission policy of one tenant–task pair (replaces the previous one)."""
        with self._lock:
            self._admission.set_policy(tenant_id, parse_task_type(task_type), policy)

    def set_global_limit(self, limit: GlobalLimit) -> None:
        """Set the active-job bounds of ``limit.task_type`` (replaces the previous ones)."""
        with self._lock:
            self._admission.set_global_limit(limit)

    def refusals(self) -> dict[str, int]:
        """How many reservations were refused, by reason (every reason listed)."""
        with self._lock:
            return self._admission.refusals()

    def last_refusal(self, tenant_id: str, task_type: TaskType | str) -> str | None:
        """The reason of the most recent refusal of this pair (kept after later admissions)."""
        with self._lock:
            return self._admission.last_refusal(tenant_id, parse_task_type(task_type))

    def reserve(
        self,
        *,
        policy_key: str,
        domain: str,
        tenant_id: str,
        task_type: TaskType | str,
        sample_count: int,
        producer_role: str,
        consumer_role: str,
        behavior_policy_version: int | None = None,
        max_policy_staleness: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> TrainingJob | None:
        """Admit a new job in state ``reserved`` with a producer lease, or refuse it.

        Returns:
            The job (its ``lease_epoch`` is the producer's lease), or None when admission
            refused it; :meth:`refusals` and :meth:`last_refusal` then say why.

        Raises:
            InvalidRequestError: a bad task type, a negative count, an integer beyond 64
                bits, or metadata that is not JSON-serialisable.
            PayloadTooLargeError: metadata longer than ``max_metadata_bytes`` as JSON.
        """
        task = parse_task_type(task_type)
        check_reserve_counts(sample_count, behavior_policy_version, max_policy_staleness)
        meta_json = metadata_json(dict(metadata or {}), self.max_metadata_bytes)
        meta = json.loads(meta_json)  # a deep copy: later changes by the caller do not leak in
        with self._lock:
            self._check_open()
            self._expire_due()
            now = self._clock.now()
            policy = self._admission.admit(tenant_id, task, producer_role, self._ix.counts, now)
            if policy is None:
                return None
            self._created_seq += 1
            seq = self._created_seq
            job_id = random_id("job")
            partition_id = derive_partition_id(job_id, domain, tenant_id, task)
            while partition_id in self._ix.live_partitions:  # a digest collision: re-draw
                job_id = random_id("job")
                partition_id = derive_partition_id(job_id, domain, tenant_id, task)
            wall = self._clock.wall()
            rec = JobRecord(
                job_id=job_id,
                policy_key=policy_key,
                tenant_id=tenant_id,
                task_type=task,
                partition_id=partition_id,
                sample_count=int(sample_count),
                domain=domain,
                metadata=meta,
                priority=policy.priority,
                created_seq=seq,
                ready_seq=None,
                behavior_policy_version=behavior_policy_version,
                max_policy_staleness=max_policy_staleness,
                producer_role=producer_role,
                consumer_role=consumer_role,
                state=_R,
                created_at=wall,
                updated_at=wall,
                lease_epoch=1,
                lease_expires_at=self._clock.now() + self.producer_lease_ttl_s,
                metadata_json=meta_json,
            )
            self._ix.add(rec)
            self._ix.track_lease(rec)
            self._persist((rec,))
            return rec.to_model()

    # ----------------------------------------------------------------- transitions

    def mark(
        self, job_id: str, state: JobState | str, *, lease_epoch: int | None = None
    ) -> TrainingJob:
        """Move a job along a Table 4 edge that needs no lease grant.

        ``reserved → ready | needs_advantages`` (producer), ``computing_actor_forward →
        needs_advantages``, ``computing_advantages → ready`` (stage workers). Marking
        ``completed``, ``failed`` or ``dropped`` is the same as :meth:`complete`,
        :meth:`fail` (reason ``marked_failed``) or :meth:`drop` (``marked_dropped``).
        Marking ends the caller's lease.

        Raises:
            IllegalTransitionError: not an edge of this job's task type, or a lease
                state (enter those with :meth:`lease_stage` / :meth:`lease_next`).
            StaleLeaseError: ``lease_epoch`` is not the job's live lease.
            JobNotFoundError: no such job.
        """
        target = parse_state(state)
        if target is JobState.COMPLETED:
            return self.complete(job_id, lease_epoch)
        if target is JobState.FAILED:
            return self.fail(job_id, "marked_failed", lease_epoch)
        if target is JobState.DROPPED:
            return self.drop(job_id, "marked_dropped", lease_epoch)
        with self._lock:
            self._check_open()
            self._expire_due()
            rec = self._get(job_id)
            fence(rec, lease_epoch)
            check_transition(rec.job_id, rec.task_type, rec.state, target)
            check_mark_target(job_id, rec.state, target)
            self._ix.move(rec, target)
            if target is JobState.READY:
                self._ready_seq += 1
                rec.ready_seq = self._ready_seq
                rec.ready_at = rec.updated_at
            self._enqueue(rec)
            self._persist((rec,))
            return rec.to_model()

    def hand_off(self, job_id: str, lease_epoch: int | None = None) -> TrainingJob:
        """End production of a ``reserved`` RL job whose next stage is actor-forward.

        The job stays ``reserved`` but the producer's lease ends, which makes it
        eligible for ``lease_stage(state="reserved", leased_state=
        "computing_actor_forward")``. Handing off a job already handed off is a no-op.

        Raises:
            IllegalTransitionError: the job is not a ``reserved`` RL job.
            StaleLeaseError: ``lease_epoch`` is not the producer's live lease.
        """
        with self._lock:
            self._check_open()
            self._expire_due()
            rec = self._get(job_id)
            check_hand_off(job_id, rec.task_type, rec.state)
            if rec.lease_expires_at is None and lease_epoch in (None, rec.lease_epoch):
                return rec.to_model()
            fence(rec, lease_epoch)
            self._ix.add_active(rec, -1)
            rec.lease_expires_at = None
            rec.updated_at = self._clock.wall()
            self._enqueue(rec)
            self._persist((rec,))
            return rec.to_model()

    def lease_stage(
        self,
        state: JobState | str,
        consumer_role: str,
        domain: str,
        leased_state: JobState | str,
    ) -> TrainingJob | None:
        """Lease the next job waiting in ``state`` into the stage state ``leased_state``.

        Order: highest priority first, then oldest (``created_seq``; ``ready_seq`` for
        ``ready``). Returns None when no job of ``consumer_role`` and ``domain`` waits.

        Raises:
            InvalidRequestError: ``leased_state`` is not the lease state that follows
                ``state`` (e.g. ``needs_advantages`` → ``computing_advantages``).
        """
        src, dst = parse_state(state), parse_state(leased_state)
        check_stage_lease(src, dst)
        with self._lock:
            self._check_open()
            self._expire_due()
            rec = self._ix.pop((src, consumer_role, domain))
            return None if rec is None else self._grant(rec, dst)

    def lease_next(self, consumer_role: str, domains: Sequence[str] | str) -> TrainingJob | None:
        """Lease the best ``ready`` job of ``consumer_role`` in any of ``domains``.

        Highest priority first; FIFO by ``ready_seq`` within a priority. None if none.
        """
        doms = (domains,) if isinstance(domains, str) else tuple(domains)
        with self._lock:
            self._check_open()
            self._expire_due()
            rec = self._ix.pop_ready(consumer_role, doms)
            return None if rec is None else self._grant(rec, JobState.LEASED)

    def heartbeat(self, job_id: str, lease_epoch: int) -> TrainingJob:
        """Extend the live lease ``lease_epoch`` of a job by one TTL from now.

        Raises:
            StaleLeaseError: the lease expired, was superseded or already ended.
        """
        with self._lock:
            self._check_open()
            self._expire_due()
            rec = self._get(job_id)
            if rec.lease_expires_at is None or rec.lease_epoch != lease_epoch:
                raise stale_lease(rec, lease_epoch)
            rec.lease_expires_at = self._clock.now() + self._ttl(rec)
            return rec.to_model()

    def complete(
        self, job_id: str, lease_epoch: int | None = None, metadata: dict[str, Any] | None = None
    ) -> TrainingJob:
        """Finish a ``leased`` job; ``metadata`` is merged into the job's metadata.

        A second ``complete`` of a completed job (same epoch, or none) is a no-op that
        returns the job unchanged.

        Raises:
            StaleLeaseError: ``lease_epoch`` is not the consumer's live lease.
            IllegalTransitionError: the job is not ``leased``.
        """
        with self._lock:
            self._check_open()
            self._expire_due()
            rec = self._get(job_id)
            if rec.state is JobState.COMPLETED and lease_epoch in (None, rec.lease_epoch):
                return rec.to_model()
            fence(rec, lease_epoch)
            check_transition(rec.job_id, rec.task_type, rec.state, JobState.COMPLETED)
            if metadata:
                rec.metadata_json = metadata_json(
                    {**rec.metadata, **metadata}, self.max_metadata_bytes
                )
                rec.metadata = json.loads(rec.metadata_json)
            self._ix.finish(rec, JobState.COMPLETED, REASON_COMPLETED)
            self._persist((rec,))
            return rec.to_model()

    def complete_recovered(self, job_id: str) -> TrainingJob:
        """Complete a job whose update is known to be applied, from any live state.

        The recovery edge of a restarted orchestrator: the consumer of a dead process
        trained the job and committed its update (the tenant's checkpoint ledger names
        it) but died before :meth:`complete`. Meanwhile its lease may have expired and
        returned it to ``ready``; either way the update must count exactly once.

        Raises:
            IllegalTransitionError: the job already ended otherwise (failed, dropped).
            JobNotFoundError: no such job.
        """
        with self._lock:
            self._check_open()
            rec = self._get(job_id)
            if rec.state is JobState.COMPLETED:
                return rec.to_model()
            check_recoverable(job_id, rec.state)
            self._ix.finish(rec, JobState.COMPLETED, REASON_COMPLETED)
            self._persist((rec,))
            return rec.to_model()

    def fail(self, job_id: str, reason: str, lease_epoch: int | None = None) -> TrainingJob:
        """Move a nonterminal job to ``failed`` with ``reason`` (kept as terminal_reason)."""
        return self._terminate(job_id, JobState.FAILED, reason, lease_epoch)

    def drop(self, job_id: str, reason: str, lease_epoch: int | None = None) -> TrainingJob:
        """Move a stale RL job (``ready`` or ``leased``) to ``dropped`` with ``reason``."""
        return self._terminate(job_id, JobState.DROPPED, reason, lease_epoch)

    def _terminate(
        self, job_id: str, target: JobState, reason: str, lease_epoch: int | None
    ) -> TrainingJob:
        if not reason:
            raise InvalidRequestError(f"a {target.value} job needs a non-empty reason")
        with self._lock:
            self._check_open()
            self._expire_due()
            rec = self._get(job_id)
            fence(rec, lease_epoch)
            check_transition(rec.job_id, rec.task_type, rec.state, target)
            self._ix.finish(rec, target, reason)
            self._persist((rec,))
            return rec.to_model()

    def expire_leases(self) -> list[TrainingJob]:
        """Expire every lease whose deadline has passed; returns the jobs it changed."""
        with self._lock:
            self._check_open()
            return [rec.to_model() for rec in self._expire_due()]

    # --------------------------------------------------------------------- waiting

    def wait_for_ready(
        self, consumer_role: str, domains: Sequence[str] | str, timeout_s: float
    ) -> bool:
        """Block this thread until a job is ``ready`` for ``consumer_role`` (or timeout)."""
        poll = self._ready_poll(consumer_role, domains)
        return wait_until(self._waiters, poll, self._next_due, timeout_s)

    async def async_wait_for_ready(
        self, consumer_role: str, domains: Sequence[str] | str, timeout_s: float
    ) -> bool:
        """Like :meth:`wait_for_ready`, but parks the task, not the event loop."""
        poll = self._ready_poll(consumer_role, domains)
        return await async_wait_until(self._waiters, poll, self._next_due, timeout_s)

    def _ready_poll(self, consumer_role: str, domains: Sequence[str] | str) -> Callable[[], bool]:
        doms = (domains,) if isinstance(domains, str) else tuple(domains)

        def poll() -> bool:  # runs under the lock
            self._check_open()
            self._expire_due()
            return self._ix.has_ready(consumer_role, doms)

        return poll

    def _next_due(self) -> float | None:
        deadline = self._ix.next_deadline()
        return None if deadline is None else deadline - self._clock.now()

    # --------------------------------------------------------------------- queries

    def get(self, job_id: str) -> TrainingJob:
        """The current snapshot of a job. Raises JobNotFoundError for unknown ids."""
        with self._lock:
            return self._get(job_id).to_model()

    def list_jobs(
        self,
        tenant_id: str | None = None,
        state: JobState | str | None = None,
        limit: int | None = None,
    ) -> list[TrainingJob]:
        """Jobs (terminal ones included) filtered by tenant and state, oldest first."""
        want = None if state is None else parse_state(state)
        with self._lock:
            recs = self._ix.select(tenant_id, want)
            if limit is not None:
                recs = recs[: max(0, limit)]
            return [rec.to_model() for rec in recs]

    def tally(self, tenant_id: str, workload_id: str | None = None) -> JobTally:
        """Counts over the tenant's jobs (of ``workload_id`` when given) with no snapshot
        per job: the Master polls it for every live workload several times a second."""
        with self._lock:
            return self._ix.tally(tenant_id, workload_id)

    def counters(self) -> dict[str, Any]:
        """``{"by_state": {state: n}, "by_tenant": {tenant: {state: n}}, "total": n}``."""
        with self._lock:
            return self._ix.counters()

    @staticmethod
    def is_stale(job: TrainingJob, actor_version: int) -> bool:
        """Eq. (1): ``rl`` job with both fields set and ``actor - behavior > max``."""
        return _is_stale(job, actor_version)

    def close(self) -> None:
        """Close the store. Later calls raise ConflictError; waiters wake and raise."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._store.close()
            self._waiters.notify()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------- internals (locked)

    def _check_open(self) -> None:
        if self._closed:
            raise ConflictError("the training scheduler is closed")

    def _get(self, job_id: str) -> JobRecord:
        rec = self._ix.jobs.get(job_id)
        if rec is None:
            raise unknown_id("job", job_id)
        return rec

    def _ttl(self, rec: JobRecord) -> float:
        return self.producer_lease_ttl_s if rec.state is _R else self.lease_ttl_s

    def _enqueue(self, rec: JobRecord) -> None:
        if self._ix.enqueue(rec):
            self._waiters.notify()

    def _grant(self, rec: JobRecord, leased_state: JobState) -> TrainingJob:
        self._ix.move(rec, leased_state)
        rec.lease_epoch += 1
        rec.lease_expires_at = self._clock.now() + self.lease_ttl_s
        if leased_state is JobState.LEASED:
            rec.leased_at = rec.updated_at
        self._ix.track_lease(rec)
        self._persist((rec,))
        return rec.to_model()

    def _expire_due(self) -> list[JobRecord]:
        changed, queued = expire_due(self._ix, self._clock.now(), self.max_attempts)
        if queued:
            self._waiters.notify()
        self._persist(changed)
        return changed

    def _persist(self, records: Sequence[JobRecord]) -> None:
        if not records:
            return
        try:
            self._store.write(records)
        except Exception as exc:
            # Memory ran ahead of the store: fall back to what is durable, so the two
            # never disagree, and tell the caller its change did not happen (a full
            # disk is the storage's fault, not a bug: 507, and the caller retries).
            self._rebuild()
            doing = f"could not persist {len(records)} training-job change(s)"
            if (full := as_storage_full(exc, doing)) is not None:
                raise full from exc
            raise InternalError(
                f"{doing}: {exc}; the scheduler reloaded its last committed state",
                job_ids=[r.job_id for r in records],
            ) from exc
