"""A full disk is recognised by what the failed write was, wherever it came from
(issue 43: safetensors and SQLite raised types the OSError-only check missed)."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

import pytest
from safetensors import SafetensorError

from joynexus.errors import InternalError, StorageFullError
from joynexus.utils.storage import as_storage_full, storage_full_cause


def _sqlite_full(tmp_path: Path) -> sqlite3.OperationalError:
    """A real SQLITE_FULL, without filling a disk: the database may not grow past
    its page limit, which SQLite answers exactly as a full disk."""
    conn = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    conn.execute("CREATE TABLE t (x BLOB)")
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    try:
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * 65536,))
    except sqlite3.OperationalError as error:
        return error
    finally:
        conn.close()
    raise AssertionError("the insert did not hit the page limit")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_an_oserror_of_a_full_disk_or_quota(code: int) -> None:
    error = OSError(code, os.strerror(code), "/run/outputs/a/step_3/x")
    fault = storage_full_cause(error)
    assert fault is not None and fault.error is error
    assert fault.reason == os.strerror(code) and fault.filename == "/run/outputs/a/step_3/x"


def test_a_safetensors_write_that_found_the_disk_full() -> None:
    # The message safetensors 0.8 raises when its write hits ENOSPC (seen on a tmpfs).
    error = SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    )
    fault = storage_full_cause(error)
    assert fault is not None and fault.error is error
    assert fault.reason == os.strerror(errno.ENOSPC)


def test_a_safetensors_error_of_another_kind_is_not_a_full_disk() -> None:
    error = SafetensorError("Error while serializing: I/O error: Permission denied (os error 13)")
    assert storage_full_cause(error) is None
    assert storage_full_cause(SafetensorError("invalid header")) is None


def test_sqlite_database_or_disk_is_full(tmp_path: Path) -> None:
    error = _sqlite_full(tmp_path)
    assert "database or disk is full" in str(error)
    fault = storage_full_cause(error)
    assert fault is not None and fault.reason == "database or disk is full"
    # The DatabaseError family in general, by its code or (older builds) its text.
    assert storage_full_cause(sqlite3.DatabaseError("database or disk is full")) is not None
    assert storage_full_cause(sqlite3.OperationalError("database is locked")) is None


def test_found_behind_a_wrapper_and_wrapped_as_507(tmp_path: Path) -> None:
    low = _sqlite_full(tmp_path)
    try:
        raise InternalError("could not persist 1 training-job change(s)") from low
    except InternalError as wrapped:
        fault = storage_full_cause(wrapped)
        assert fault is not None and fault.error is low
        full = as_storage_full(wrapped, "could not record")
    assert isinstance(full, StorageFullError) and full.http_status == 507
    assert "database or disk is full" in full.message


def test_a_storage_full_error_counts_by_itself_and_others_do_not() -> None:
    fault = storage_full_cause(StorageFullError("tenant 'a' is past its disk quota"))
    assert fault is not None and "disk quota" in fault.reason
    assert storage_full_cause(OSError(errno.EACCES, "denied")) is None
    assert storage_full_cause(ValueError("no")) is None
    assert as_storage_full(ValueError("no"), "x") is None
