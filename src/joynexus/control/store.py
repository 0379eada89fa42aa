"""Where training-job descriptors live between processes: in memory or in SQLite.

The scheduler keeps every job as a plain :class:`JobRecord` in its own indexes (a
pydantic model per change would cost more than the change itself) and writes the
changed records through a :class:`JobStore` inside its lock, so the store sees
transitions in the order they happened. A store only has to persist rows and give
them back; it does no scheduling.

:class:`SQLiteJobStore` commits every write in one transaction on a WAL database with
``synchronous=NORMAL``: a committed transition survives a crash of the process (it
may be lost only if the whole machine loses power before the WAL is checkpointed).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from joynexus.control.job import JobState, JobTimestamps, TaskType, TrainingJob
from joynexus.errors import InvalidRequestError
from joynexus.utils.jsondepth import MAX_JSON_DEPTH, json_depth_problem

SCHEMA_VERSION = 1

log = logging.getLogger(__name__)

#: The one key of the metadata a job shows when its stored metadata cannot be served.
WITHHELD_METADATA_KEY = "metadata_withheld"


def withheld_metadata() -> dict[str, Any]:
    """What a job shows instead of stored metadata nested past
    :data:`~joynexus.utils.jsondepth.MAX_JSON_DEPTH` levels (stored by an older version)."""
    return {
        WITHHELD_METADATA_KEY: (
            f"the stored metadata nests more than {MAX_JSON_DEPTH} levels, past what an "
            "answer can carry; the scheduler database still holds it"
        )
    }


_COLUMNS: tuple[str, ...] = (
    "job_id",
    "policy_key",
    "tenant_id",
    "task_type",
    "partition_id",
    "sample_count",
    "domain",
    "metadata",
    "priority",
    "created_seq",
    "ready_seq",
    "behavior_policy_version",
    "max_policy_staleness",
    "producer_role",
    "consumer_role",
    "state",
    "created_at",
    "updated_at",
    "ready_at",
    "leased_at",
    "finished_at",
    "terminal_reason",
    "lease_epoch",
    "lease_expires_at",
    "attempts",
)

Row = tuple[Any, ...]


@dataclass(slots=True)
class JobRecord:
    """The scheduler's mutable, internal form of a :class:`TrainingJob`."""

    job_id: str
    policy_key: str
    tenant_id: str
    task_type: TaskType
    partition_id: str
    sample_count: int
    domain: str
    metadata: dict[str, Any]
    priority: int
    created_seq: int
    ready_seq: int | None
    behavior_policy_version: int | None
    max_policy_staleness: int | None
    producer_role: str
    consumer_role: str
    state: JobState
    created_at: float
    updated_at: float
    ready_at: float | None = None
    leased_at: float | None = None
    finished_at: float | None = None
    terminal_reason: str | None = None
    lease_epoch: int = 0
    lease_expires_at: float | None = None
    attempts: int = 0
    # JSON of ``metadata``, cached because metadata changes far less often than state.
    metadata_json: str | None = field(default=None, repr=False)

    def to_row(self) -> Row:
        if self.metadata_json is None:
            self.metadata_json = json.dumps(self.metadata, sort_keys=True)
        return (
            self.job_id,
            self.policy_key,
            self.tenant_id,
            self.task_type.value,
            self.partition_id,
            self.sample_count,
            self.domain,
            self.metadata_json,
            self.priority,
            self.created_seq,
            self.ready_seq,
            self.behavior_policy_version,
            self.max_policy_staleness,
            self.producer_role,
            self.consumer_role,
            self.state.value,
            self.created_at,
            self.updated_at,
            self.ready_at,
            self.leased_at,
            self.finished_at,
            self.terminal_reason,
            self.lease_epoch,
            self.lease_expires_at,
            self.attempts,
        )

    @classmethod
    def from_row(cls, row: Row) -> JobRecord:
        values = dict(zip(_COLUMNS, row, strict=True))
        metadata_json = str(values.pop("metadata"))
        values["task_type"] = TaskType(values["task_type"])
        values["state"] = JobState(values["state"])
        metadata = _servable_metadata(str(values["job_id"]), metadata_json)
        return cls(**values, metadata=metadata, metadata_json=metadata_json)

    def to_model(self) -> TrainingJob:
        """An immutable snapshot; skips validation because the record is already valid."""
        stamps = _construct(
            JobTimestamps,
            {
                "created_at": self.created_at,
                "updated_at": self.updated_at,
                "ready_at": self.ready_at,
                "leased_at": self.leased_at,
                "finished_at": self.finished_at,
            },
        )
        return _construct(
            TrainingJob,
            dict(
                job_id=self.job_id,
                policy_key=self.policy_key,
                tenant_id=self.tenant_id,
                task_type=self.task_type,
                partition_id=self.partition_id,
                sample_count=self.sample_count,
                domain=self.domain,
                metadata=dict(self.metadata),
                priority=self.priority,
                created_seq=self.created_seq,
                ready_seq=self.ready_seq,
                behavior_policy_version=self.behavior_policy_version,
                max_policy_staleness=self.max_policy_staleness,
                producer_role=self.producer_role,
                consumer_role=self.consumer_role,
                state=self.state,
                timestamps=stamps,
                terminal_reason=self.terminal_reason,
                lease_epoch=self.lease_epoch,
                lease_expires_at=self.lease_expires_at,
                attempts=self.attempts,
            ),
        )


def _servable_metadata(job_id: str, text: str) -> dict[str, Any]:
    """A stored job's metadata, or :func:`withheld_metadata` when it nests deeper than
    any answer can serialize: an older version stored such metadata, and served as it is
    it would fail every listing of the tenant's jobs. The row keeps the original (it is
    rewritten only if the job's metadata changes again)."""
    try:
        metadata: dict[str, Any] = json.loads(text)
        problem = json_depth_problem(metadata, MAX_JSON_DEPTH, f"metadata of job {job_id!r}")
    except RecursionError:
        problem = f"metadata of job {job_id!r} nests too deep to decode"
    if problem is None:
        return metadata
    log.warning("%s; it is served as %r", problem, WITHHELD_METADATA_KEY)
    return withheld_metadata()


_new = object.__new__
_setattr = object.__setattr__
_ModelT = TypeVar("_ModelT", TrainingJob, JobTimestamps)
_FIELDS_SET: dict[type[BaseModel], set[str]] = {
    TrainingJob: set(TrainingJob.model_fields),
    JobTimestamps: set(JobTimestamps.model_fields),
}


def _construct(cls: type[_ModelT], values: dict[str, Any]) -> _ModelT:
    """``cls.model_construct(**values)`` for a complete set of trusted field values.

    pydantic's generic ``model_construct`` (defaults, aliases, extras) was half of a
    transition's cost; the scheduler always supplies every field, so it sets the
    instance state directly. A test checks the result equals a validated model.
    """
    obj = _new(cls)
    _setattr(obj, "__dict__", values)
    _setattr(obj, "__pydantic_fields_set__", _FIELDS_SET[cls].copy())
    _setattr(obj, "__pydantic_extra__", None)
    _setattr(obj, "__pydantic_private__", None)
    return obj


class JobStore(Protocol):
    """Persistence of job records. Calls arrive under the scheduler's lock, in order."""

    def load(self) -> list[JobRecord]:
        """Every stored job (terminal ones included), in no particular order."""
        ...

    def write(self, records: Sequence[JobRecord]) -> None:
        """Persist the current form of ``records`` atomically (all or none)."""
        ...

    def close(self) -> None:
        """Release resources; further calls are errors."""
        ...


class InMemoryJobStore:
    """Keeps rows in a dict: nothing survives the process, but a second scheduler
    built on the same store object recovers exactly as it would from SQLite (tests
    use this to exercise recovery without a file)."""

    def __init__(self) -> None:
        self._rows: dict[str, Row] = {}

    def load(self) -> list[JobRecord]:
        return [JobRecord.from_row(row) for row in self._rows.values()]

    def write(self, records: Sequence[JobRecord]) -> None:
        rows = self._rows
        for record in records:
            rows[record.job_id] = record.to_row()

    def close(self) -> None:
        pass


class SQLiteJobStore:
    """A SQLite file in WAL mode; every :meth:`write` is one committed transaction.

    Args:
        path: The database file; its parent directory is created when missing.

    Raises:
        InvalidRequestError: the file holds a job table of another schema version.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: a single-row write is its own implicit transaction (the
        # cheapest commit SQLite has); multi-row writes open one explicitly.
        self._conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        # The scheduler serialises calls already; this guards direct use of the store.
        self._lock = threading.Lock()
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._init_schema()
        placeholders = ", ".join("?" for _ in _COLUMNS)
        self._upsert = (
            f"INSERT OR REPLACE INTO jobs ({', '.join(_COLUMNS)}) VALUES ({placeholders})"
        )

    def _init_schema(self) -> None:
        conn = self._conn
        conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        elif int(row[0]) != SCHEMA_VERSION:
            raise InvalidRequestError(
                f"scheduler database {self.path} has schema version {row[0]}, "
                f"expected {SCHEMA_VERSION}; use a new file or migrate it",
                path=str(self.path),
                schema_version=int(row[0]),
                expected=SCHEMA_VERSION,
            )
        # Only the primary key is indexed: queries are served from the scheduler's
        # in-memory indexes, and every extra index would slow each transition down.
        columns = ",\n  ".join(
            f"{name} TEXT PRIMARY KEY" if name == "job_id" else name for name in _COLUMNS
        )
        conn.execute(f"CREATE TABLE IF NOT EXISTS jobs (\n  {columns}\n)")

    def load(self) -> list[JobRecord]:
        with self._lock:
            cursor = self._conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs")
            return [JobRecord.from_row(tuple(row)) for row in cursor]

    def write(self, records: Sequence[JobRecord]) -> None:
        if not records:
            return
        with self._lock:
            conn = self._conn
            if len(records) == 1:
                conn.execute(self._upsert, records[0].to_row())
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(self._upsert, _rows(records))
                conn.execute("COMMIT")
            except BaseException:
                # A COMMIT that found the disk full leaves the transaction open: end
                # it, or every later write would fail "cannot start a transaction".
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _rows(records: Iterable[JobRecord]) -> Iterable[Row]:
    return (record.to_row() for record in records)
