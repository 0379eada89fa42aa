"""The job store on a full disk (issue 43): SQLite's "database or disk is full" is a
storage fault (507, retried by the loops), not an internal error, and a write that
found the disk full leaves the store usable once space returns."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from joynexus.control.job import JobState
from joynexus.control.scheduler import TrainingScheduler
from joynexus.control.store import SQLiteJobStore
from joynexus.errors import StorageFullError
from joynexus.utils.clock import FakeClock

from .conftest import make_ready, reserve


def _limit_pages(conn: sqlite3.Connection, extra: int) -> None:
    """Let the database grow by ``extra`` pages at most: SQLite answers SQLITE_FULL
    past it, exactly as on a full disk (no disk is filled)."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + extra}")


def _conn(sched: TrainingScheduler) -> sqlite3.Connection:
    store = sched._store  # the test reaches the connection to bound its file
    assert isinstance(store, SQLiteJobStore)
    return store._conn


def test_a_full_job_store_answers_storage_full_and_recovers(tmp_path: Path) -> None:
    sched = TrainingScheduler.open(tmp_path / "s.sqlite", clock=FakeClock(), lease_ttl_s=10.0)
    job = reserve(sched)
    # Big metadata: each new row needs pages the full database does not have.
    big = {"schema_signature": "sig-a", "pad": "x" * 20_000}
    _limit_pages(_conn(sched), 0)
    with pytest.raises(StorageFullError, match="database or disk is full") as caught:
        reserve(sched, metadata=big)
    assert caught.value.http_status == 507
    # Memory fell back to what is committed: the refused job does not exist.
    assert [j.job_id for j in sched.list_jobs()] == [job.job_id]
    _conn(sched).execute("PRAGMA max_page_count = 1073741823")  # space is back
    again = reserve(sched, metadata=big)
    assert make_ready(sched, again).state is JobState.READY
    sched.close()
    reopened = TrainingScheduler.open(tmp_path / "s.sqlite", clock=FakeClock(), lease_ttl_s=10.0)
    assert {j.job_id for j in reopened.list_jobs()} == {job.job_id, again.job_id}
    reopened.close()


def test_a_multi_row_write_that_found_the_disk_full_leaves_no_open_transaction(
    tmp_path: Path,
) -> None:
    sched = TrainingScheduler.open(tmp_path / "s.sqlite", clock=FakeClock(), lease_ttl_s=10.0)
    reserve(sched, metadata={"schema_signature": "s", "pad": "x" * 20_000})
    store = sched._store
    assert isinstance(store, SQLiteJobStore)
    records = store.load()  # the rows as they are, grown below
    for rec in records:
        rec.metadata_json = '{"pad": "' + "y" * 200_000 + '"}'
    _limit_pages(store._conn, 0)
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        store.write(records * 2)  # two rows: one explicit transaction
    assert not store._conn.in_transaction
    store._conn.execute("PRAGMA max_page_count = 1073741823")
    store.write(records * 2)  # would fail "cannot start a transaction within one"
    sched.close()
