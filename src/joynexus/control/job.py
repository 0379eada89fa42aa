"""The training-job descriptor (paper Table 3) and its lifecycle (Table 4).

A :class:`TrainingJob` is control metadata only: it never holds tensors. Its
``partition_id`` is the capability by which the producer, the preprocessing stages
and the actor address the job's data in the Training Queue.

Lifecycle (edges that :func:`check_transition` accepts)::

    SFT  reserved ──────────────────────────────────────────────► ready ─► leased ─► completed
    RL   reserved ─[► computing_actor_forward]─► needs_advantages
                          ─► computing_advantages ─► ready ─► leased ─► completed
    any nonterminal state ─► failed
    RL in ready or leased ─► dropped          (stale: Eq. (1), see ``is_stale``)

``computing_actor_forward``, ``computing_advantages`` and ``leased`` are *lease
states*: a job enters them only through ``lease_stage`` / ``lease_next``, which
grant a fenced lease to one worker. When such a lease expires, the job returns to
the state it was leased from (:data:`LEASE_RETURN`); that return is the only other
movement a job makes and it is not available to callers.

How the optional actor-forward stage fits Table 4 (there is no ``needs_actor_forward``
state): ``reserved`` covers "the producer is writing the rollout" *and* "the rollout
is written, waiting for actor-forward". The two are told apart by the producer lease
that ``reserve`` grants: while the producer holds it, the partition may be partial
and no stage may touch the job. A producer whose pipeline has an actor-forward stage
ends production with ``TrainingScheduler.hand_off`` (the job stays ``reserved`` but
loses its producer lease); an actor-forward worker then ``lease_stage``\\ s it from
``reserved`` into ``computing_actor_forward`` and marks it ``needs_advantages``. A
pipeline without that stage marks ``needs_advantages`` directly, as in Appendix A.4.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from joynexus.errors import IllegalTransitionError, InvalidRequestError, PayloadTooLargeError
from joynexus.utils.jsondepth import MAX_JSON_DEPTH, json_depth_problem


class JobState(StrEnum):
    """States of a training job (paper Table 4)."""

    RESERVED = "reserved"
    COMPUTING_ACTOR_FORWARD = "computing_actor_forward"
    NEEDS_ADVANTAGES = "needs_advantages"
    COMPUTING_ADVANTAGES = "computing_advantages"
    READY = "ready"
    LEASED = "leased"
    COMPLETED = "completed"
    FAILED = "failed"
    DROPPED = "dropped"


class TaskType(StrEnum):
    """Kinds of training work the scheduler carries (evaluation creates no jobs)."""

    RL = "rl"
    SFT = "sft"


TERMINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.DROPPED}
)

#: States entered only through a lease grant (``lease_stage`` / ``lease_next``). A
#: ``reserved`` job may hold a lease too: the producer's, granted by ``reserve``.
LEASE_STATES: frozenset[JobState] = frozenset(
    {JobState.COMPUTING_ACTOR_FORWARD, JobState.COMPUTING_ADVANTAGES, JobState.LEASED}
)

#: Where an expired stage or consumer lease sends a job back to.
LEASE_RETURN: dict[JobState, JobState] = {
    JobState.COMPUTING_ACTOR_FORWARD: JobState.RESERVED,
    JobState.COMPUTING_ADVANTAGES: JobState.NEEDS_ADVANTAGES,
    JobState.LEASED: JobState.READY,
}

_S = JobState
_SFT_EDGES: dict[JobState, frozenset[JobState]] = {
    _S.RESERVED: frozenset({_S.READY, _S.FAILED}),
    _S.READY: frozenset({_S.LEASED, _S.FAILED}),
    _S.LEASED: frozenset({_S.COMPLETED, _S.FAILED}),
}
_RL_EDGES: dict[JobState, frozenset[JobState]] = {
    _S.RESERVED: frozenset({_S.COMPUTING_ACTOR_FORWARD, _S.NEEDS_ADVANTAGES, _S.FAILED}),
    _S.COMPUTING_ACTOR_FORWARD: frozenset({_S.NEEDS_ADVANTAGES, _S.FAILED}),
    _S.NEEDS_ADVANTAGES: frozenset({_S.COMPUTING_ADVANTAGES, _S.FAILED}),
    _S.COMPUTING_ADVANTAGES: frozenset({_S.READY, _S.FAILED}),
    _S.READY: frozenset({_S.LEASED, _S.FAILED, _S.DROPPED}),
    _S.LEASED: frozenset({_S.COMPLETED, _S.FAILED, _S.DROPPED}),
}

#: The Table 4 edges, per task type. Terminal states have no outgoing edges.
ALLOWED_TRANSITIONS: dict[TaskType, dict[JobState, frozenset[JobState]]] = {
    TaskType.SFT: {s: _SFT_EDGES.get(s, frozenset()) for s in JobState},
    TaskType.RL: {s: _RL_EDGES.get(s, frozenset()) for s in JobState},
}


def check_transition(job_id: str, task_type: TaskType, src: JobState, dst: JobState) -> None:
    """Raise unless ``src → dst`` is a Table 4 edge for ``task_type``.

    Raises:
        IllegalTransitionError: naming the job, both states and the allowed targets.
    """
    targets = ALLOWED_TRANSITIONS[task_type][src]
    if dst not in targets:
        allowed = ", ".join(sorted(t.value for t in targets)) or "none (terminal state)"
        raise IllegalTransitionError(
            f"training job {job_id!r} ({task_type.value} task) cannot move from "
            f"{src.value!r} to {dst.value!r}; allowed targets from {src.value!r}: {allowed}",
            job_id=job_id,
            task_type=str(task_type),
            from_state=str(src),
            to_state=str(dst),
            allowed=sorted(str(t) for t in targets),
        )


def check_mark_target(job_id: str, src: JobState, dst: JobState) -> None:
    """Raise unless ``dst`` may be entered by marking: lease states need a lease grant."""
    if dst in LEASE_STATES:
        raise IllegalTransitionError(
            f"training job {job_id!r}: {dst!r} is a lease state; enter it with "
            f"lease_stage(state={src.value!r}, leased_state={dst.value!r})"
            + (" or lease_next()" if dst is JobState.LEASED else ""),
            job_id=job_id,
            from_state=src.value,
            to_state=dst.value,
        )


def check_stage_lease(src: JobState, dst: JobState) -> None:
    """Raise unless ``dst`` is the stage lease state that follows the waiting ``src``."""
    if LEASE_RETURN.get(dst) is not src:
        pairs = ", ".join(f"{v.value}->{k.value}" for k, v in LEASE_RETURN.items())
        raise InvalidRequestError(
            f"cannot lease from {src.value!r} into {dst.value!r}; stage leases are: {pairs}",
            field="leased_state",
        )


def check_hand_off(job_id: str, task_type: TaskType, state: JobState) -> None:
    """Raise unless the job is a ``reserved`` RL job (the only ones with actor-forward)."""
    if state is not JobState.RESERVED or task_type is not TaskType.RL:
        raise IllegalTransitionError(
            f"training job {job_id!r} ({task_type.value}, {state.value!r}) "
            "cannot be handed off: only reserved RL jobs have an actor-forward stage",
            job_id=job_id,
            from_state=state.value,
        )


def check_recoverable(job_id: str, state: JobState) -> None:
    """Raise if the job ended other than completed: it cannot be recovered as completed."""
    if state in TERMINAL_STATES and state is not JobState.COMPLETED:
        raise IllegalTransitionError(
            f"training job {job_id!r} already ended {state.value}; it cannot be "
            "recovered as completed",
            job_id=job_id,
            from_state=state.value,
            to_state=JobState.COMPLETED.value,
        )


def derive_partition_id(job_id: str, domain: str, tenant_id: str, task_type: TaskType) -> str:
    """The Training Queue partition of a job: a digest of its identities (Appendix A.2)."""
    ident = "\x1f".join((job_id, domain, tenant_id, task_type.value))
    return "part-" + hashlib.blake2b(ident.encode(), digest_size=12).hexdigest()


def parse_task_type(task_type: TaskType | str) -> TaskType:
    """``TaskType(task_type)``, raising InvalidRequestError that lists the valid ones."""
    try:
        return TaskType(task_type)
    except ValueError:
        allowed = ", ".join(t.value for t in TaskType)
        raise InvalidRequestError(
            f"unknown task_type {task_type!r}; expected one of: {allowed}",
            field="task_type",
            allowed=[t.value for t in TaskType],
        ) from None


def parse_state(state: JobState | str) -> JobState:
    """``JobState(state)``, raising InvalidRequestError that lists the valid ones."""
    try:
        return JobState(state)
    except ValueError:
        allowed = ", ".join(s.value for s in JobState)
        raise InvalidRequestError(
            f"unknown job state {state!r}; expected one of: {allowed}",
            field="state",
            allowed=[s.value for s in JobState],
        ) from None


#: Integers stored with a job must fit SQLite's signed 64-bit INTEGER.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def check_int64(name: str, value: int | None) -> None:
    """InvalidRequestError unless ``value`` (if any) fits a signed 64-bit integer."""
    if value is not None and not INT64_MIN <= value <= INT64_MAX:
        raise InvalidRequestError(
            f"{name} = {value} does not fit a 64-bit integer (allowed: {INT64_MIN} .. {INT64_MAX})",
            field=name,
        )


def check_reserve_counts(
    sample_count: int, behavior_policy_version: int | None, max_policy_staleness: int | None
) -> None:
    """The integer arguments of ``reserve``, checked before anything is indexed: SQLite
    stores 64-bit integers only, and a failed write would make the scheduler reload its
    whole state.

    Raises:
        InvalidRequestError: an integer beyond 64 bits, or a negative count.
    """
    check_int64("sample_count", sample_count)
    check_int64("behavior_policy_version", behavior_policy_version)
    check_int64("max_policy_staleness", max_policy_staleness)
    if sample_count < 0:
        raise InvalidRequestError(
            f"sample_count must be >= 0, got {sample_count}", field="sample_count"
        )
    if max_policy_staleness is not None and max_policy_staleness < 0:
        raise InvalidRequestError(
            f"max_policy_staleness must be >= 0 or None, got {max_policy_staleness}",
            field="max_policy_staleness",
        )


def unicode_problem(value: Any, where: str = "metadata") -> str | None:
    """Where ``value`` (JSON data) holds a string that is not valid Unicode (a lone
    surrogate such as ``"\\ud800"``, which JSON can spell but UTF-8 cannot encode), or
    None. Stored, such a string fails every later response that includes it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            problem = unicode_problem(k, f"{where} (a key)") or unicode_problem(
                v, f"{where}[{k!r}]" if isinstance(k, str) and _encodable(k) else where
            )
            if problem is not None:
                return problem
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            problem = unicode_problem(v, f"{where}[{i}]")
            if problem is not None:
                return problem
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def metadata_json(metadata: dict[str, Any], max_bytes: int | None = None) -> str:
    """Canonical JSON of job metadata.

    Raises:
        InvalidRequestError: it is not JSON data, or nests deeper than
            :data:`~joynexus.utils.jsondepth.MAX_JSON_DEPTH` levels.
        PayloadTooLargeError: its JSON is longer than ``max_bytes`` (UTF-8 bytes).
    """
    # Checked up front: metadata that cannot round-trip through the store would come
    # back different after a restart (or, holding a lone surrogate or nested past what
    # pydantic serializes, not at all). The depth first: the text check recurses.
    deep = json_depth_problem(metadata, MAX_JSON_DEPTH, "job metadata")
    if deep is not None:
        raise InvalidRequestError(deep, field="metadata", limit_depth=MAX_JSON_DEPTH)
    bad = unicode_problem(metadata)
    if bad is not None:
        raise InvalidRequestError(
            f"job metadata: {bad} holds a string that is not valid Unicode (a lone "
            "surrogate such as \\ud800); send UTF-8 text",
            field="metadata",
        )
    try:
        text = json.dumps(metadata, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(
            f"job metadata must be JSON-serialisable: {exc}", field="metadata"
        ) from None
    if max_bytes is not None and len(text) > max_bytes:  # ensure_ascii: chars == bytes
        raise PayloadTooLargeError(
            f"job metadata of {len(text)} bytes (serialized JSON) exceeds the Training "
            f"Scheduler's limit of {max_bytes} bytes; keep large data elsewhere and put a "
            "reference in the metadata",
            field="metadata",
            limit_bytes=max_bytes,
            size_bytes=len(text),
        )
    return text


@dataclass(frozen=True)
class JobTally:
    """Counts over a set of jobs (:meth:`TrainingScheduler.tally`).

    Attributes:
        failed_by_reason: Failed jobs per ``terminal_reason``.
        completed_span_s: Summed ``finished_at - created_at`` of the completed jobs.
    """

    total: int
    terminal: int
    completed: int
    dropped: int
    failed_by_reason: dict[str | None, int]
    completed_span_s: float

    @property
    def in_flight(self) -> int:
        return self.total - self.terminal

    def failed_except(self, reasons: Sequence[str]) -> int:
        """Failed jobs whose reason is not one of ``reasons``."""
        return sum(n for r, n in self.failed_by_reason.items() if r not in reasons)


class JobTimestamps(BaseModel):
    """Wall-clock (Unix seconds) times of a job's lifecycle events."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    created_at: float
    updated_at: float
    ready_at: float | None = None
    leased_at: float | None = None
    finished_at: float | None = None


class TrainingJob(BaseModel):
    """A snapshot of one training-job descriptor (paper Table 3, plus its lease).

    Snapshots are immutable: the scheduler returns a fresh one after every change.
    Treat ``metadata`` as read-only too (it is shallow-copied per snapshot).
    Fields can also be read as ``job["partition_id"]``, as in the paper's pseudocode.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # identity
    job_id: str
    policy_key: str
    tenant_id: str
    task_type: TaskType
    # data binding
    partition_id: str
    sample_count: int = Field(ge=0)
    # compatibility (metadata["schema_signature"] names the canonical VLA interface)
    domain: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    # ordering
    priority: int = 0
    created_seq: int
    ready_seq: int | None = None
    # RL consistency
    behavior_policy_version: int | None = None
    max_policy_staleness: int | None = None
    # lifecycle
    producer_role: str
    consumer_role: str
    state: JobState
    timestamps: JobTimestamps
    terminal_reason: str | None = None
    # lease (on the scheduler clock's ``now()`` timeline; None = nobody holds one)
    lease_epoch: int = 0
    lease_expires_at: float | None = None
    attempts: int = 0

    def __getitem__(self, name: str) -> Any:
        if name in TrainingJob.model_fields or name in JobTimestamps.model_fields:
            return getattr(self, name)
        raise KeyError(name)

    @property
    def is_terminal(self) -> bool:
        """True once the job is completed, failed or dropped."""
        return self.state in TERMINAL_STATES

    @property
    def has_lease(self) -> bool:
        """True while some worker (producer, stage or actor) holds this job's lease."""
        return self.lease_expires_at is not None

    @property
    def schema_signature(self) -> str | None:
        """``metadata["schema_signature"]``, when the producer set it."""
        sig = self.metadata.get("schema_signature")
        return None if sig is None else str(sig)

    @property
    def created_at(self) -> float:
        return self.timestamps.created_at

    @property
    def updated_at(self) -> float:
        return self.timestamps.updated_at

    @property
    def ready_at(self) -> float | None:
        return self.timestamps.ready_at

    @property
    def leased_at(self) -> float | None:
        return self.timestamps.leased_at

    @property
    def finished_at(self) -> float | None:
        return self.timestamps.finished_at


def is_stale(job: TrainingJob, actor_version: int) -> bool:
    """Eq. (1): an RL job is stale when ``actor_version - behavior > max_staleness``.

    Never true for SFT jobs, nor when either recorded field is None.
    """
    if job.task_type != TaskType.RL:
        return False
    behavior, bound = job.behavior_policy_version, job.max_policy_staleness
    if behavior is None or bound is None:
        return False
    return actor_version - behavior > bound
