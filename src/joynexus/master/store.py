"""Durable workload records of the Master Service.

A workload record is what the Master needs to bring a workload back after its process
died: the compiled spec, the lifecycle state, the progress baseline its completion
target counts from, and how it ended. Records live in the run directory's
``scheduler.sqlite`` — the database that already holds the Training Scheduler's jobs —
in a table of their own (``workloads``), so one file is the whole control state of a
run: copy it and the tenants' checkpoints, and the run moves with them.

Each write is one SQLite transaction of its own (WAL, ``synchronous=FULL``); the
scheduler commits its job transitions in its own transactions on the same file. The
two never need to commit together because recovery derives everything else from them
idempotently: a workload's progress is counted from the jobs tagged with its id, and
its weights from the tenant's latest checkpoint (see
:meth:`joynexus.master.service.MasterService.start`).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from joynexus.api import WorkloadState
from joynexus.utils.storage import as_storage_full

__all__ = ["InMemoryWorkloadStore", "SQLiteWorkloadStore", "WorkloadRecord", "WorkloadStore"]


class WorkloadRecord(BaseModel):
    """One workload as it is stored.

    Attributes:
        workload_id: Its id (``wl-<random hex>``).
        tenant_id: Its tenant.
        seq: Submission order (ids are issued above the highest stored).
        spec: The workload spec as JSON data (``WorkloadSpec.model_dump(mode="json")``).
        state: Lifecycle state.
        created_at / finished_at: Wall-clock times.
        completed_before: The tenant's completed jobs of this task type when the
            workload first started; its completion target counts from there.
        eval_runs: Evaluation runs finished (eval workloads).
        error: Why it failed.
        restarts: How often a restart of the server resumed it.
        final_version: The tenant's policy version when the workload ended (rl, sft,
            custom), so its status keeps it after later workloads of the tenant.
    """

    model_config = ConfigDict(extra="forbid")

    workload_id: str
    tenant_id: str
    seq: int = Field(ge=0)
    spec: dict[str, Any]
    state: WorkloadState
    created_at: float
    finished_at: float | None = None
    completed_before: int | None = None
    eval_runs: int = 0
    error: str | None = None
    restarts: int = 0
    final_version: int | None = None


class WorkloadStore:
    """Where workload records are kept (the interface; see the two implementations)."""

    def load(self) -> list[WorkloadRecord]:
        """Every record, in submission order."""
        raise NotImplementedError

    def put(self, record: WorkloadRecord) -> None:
        """Insert or replace ``record`` (one transaction)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the store (records written so far stay)."""


class InMemoryWorkloadStore(WorkloadStore):
    """Records in memory: a Master whose workloads need not outlive it (tests)."""

    def __init__(self) -> None:
        self._records: dict[str, WorkloadRecord] = {}

    def load(self) -> list[WorkloadRecord]:
        return sorted((r.model_copy() for r in self._records.values()), key=lambda r: r.seq)

    def put(self, record: WorkloadRecord) -> None:
        self._records[record.workload_id] = record.model_copy()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS workloads (
    workload_id TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    state       TEXT NOT NULL,
    record_json TEXT NOT NULL
)
"""


class SQLiteWorkloadStore(WorkloadStore):
    """Records in the ``workloads`` table of a SQLite file (WAL, full sync).

    Args:
        path: The database file (the run directory's ``scheduler.sqlite``).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0)
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute(_SCHEMA)
            self._conn.commit()

    def load(self) -> list[WorkloadRecord]:
        with self._lock:
            rows = self._conn.execute("SELECT record_json FROM workloads ORDER BY seq").fetchall()
        return [WorkloadRecord.model_validate(json.loads(r[0])) for r in rows]

    def put(self, record: WorkloadRecord) -> None:
        """Commit ``record`` (insert or replace).

        Raises:
            StorageFullError: the disk is full; nothing was written (retry later).
        """
        with self._lock:
            try:
                self._conn.execute(
                    "INSERT OR REPLACE INTO workloads (workload_id, tenant_id, seq, state, "
                    "record_json) VALUES (?, ?, ?, ?, ?)",
                    (
                        record.workload_id,
                        record.tenant_id,
                        record.seq,
                        record.state.value,
                        record.model_dump_json(),
                    ),
                )
                self._conn.commit()
            except sqlite3.Error as error:
                # A failed commit leaves its transaction open: end it, so the next
                # put starts clean once space returns.
                with contextlib.suppress(sqlite3.Error):
                    self._conn.rollback()
                full = as_storage_full(error, f"could not record workload {record.workload_id}")
                if full is not None:
                    raise full from error
                raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()
