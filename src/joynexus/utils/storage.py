"""Recognising a full disk by what the failed write was, wherever it came from.

A full disk (or a full user quota) does not reach us as one exception type: plain file
I/O raises ``OSError(ENOSPC | EDQUOT)``, safetensors raises its own ``SafetensorError``
whose message carries the OS error ("… No space left on device (os error 28)"), and
SQLite answers ``SQLITE_FULL`` ("database or disk is full") as an
``OperationalError``. The service must treat all of them as the same fault — roll
back, show it, answer 507, wait for space — so they are classified here, once.

Nothing here imports safetensors: an error of that type can only exist once the
package was imported by whoever raised it, so it is looked up in ``sys.modules``.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
import sys
from dataclasses import dataclass

from joynexus.errors import StorageFullError

__all__ = ["STORAGE_FULL_ERRNOS", "StorageFault", "as_storage_full", "storage_full_cause"]

#: What a write answers when the disk (ENOSPC) or the user's quota (EDQUOT) is full.
STORAGE_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: The OS error inside a Rust ``std::io::Error`` message (safetensors): its Display
#: form "... (os error 28)" and its Debug form "Os { code: 28, ... }".
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")
#: The same, where only the kind survived (Debug form without a code).
_RUST_FULL_KINDS = ("StorageFull", "QuotaExceeded", "FilesystemQuotaExceeded")
#: SQLite's result code of a write that found no space.
_SQLITE_FULL = getattr(sqlite3, "SQLITE_FULL", 13)


@dataclass(frozen=True, slots=True)
class StorageFault:
    """A write that failed because the storage is full.

    Attributes:
        error: The exception recognised (the lowest one of the chain that says so).
        reason: What the storage answered, for people ("No space left on device").
        filename: The file being written, when the error names it.
    """

    error: BaseException
    reason: str
    filename: str | None = None


def _os_fault(error: OSError) -> StorageFault | None:
    if error.errno not in STORAGE_FULL_ERRNOS:
        return None
    reason = error.strerror or os.strerror(error.errno or errno.ENOSPC)
    name = error.filename if isinstance(error.filename, str) else None
    return StorageFault(error, reason, name)


def _safetensors_fault(error: BaseException) -> StorageFault | None:
    module = sys.modules.get("safetensors")
    cls = getattr(module, "SafetensorError", None)
    if not isinstance(cls, type) or not isinstance(error, cls):
        return None
    text = str(error)
    for match in _RUST_OS_ERROR.finditer(text):
        code = int(match.group(1) or match.group(2))
        if code in STORAGE_FULL_ERRNOS:
            return StorageFault(error, os.strerror(code))
    if any(kind in text for kind in _RUST_FULL_KINDS):
        return StorageFault(error, os.strerror(errno.ENOSPC))
    return None


def _sqlite_fault(error: sqlite3.Error) -> StorageFault | None:
    code = getattr(error, "sqlite_errorcode", None)
    # The primary code is the low byte of an extended one; older builds give only text.
    full = (code & 0xFF) == _SQLITE_FULL if isinstance(code, int) else None
    if full is None:
        full = "database or disk is full" in str(error)
    return StorageFault(error, "database or disk is full") if full else None


def _fault_of(error: BaseException) -> StorageFault | None:
    if isinstance(error, OSError):
        return _os_fault(error)
    if isinstance(error, sqlite3.Error):
        return _sqlite_fault(error)
    return _safetensors_fault(error)


def storage_full_cause(error: BaseException | None) -> StorageFault | None:
    """The full-storage fault behind ``error`` (itself, or along its causes), or None.

    The lowest recognised error of the chain wins (it names the file and what the OS
    said); a :class:`~joynexus.errors.StorageFullError` whose cause is gone still
    counts, with its own message as the reason.
    """
    wrapper: StorageFault | None = None
    seen = 0
    while error is not None and seen < 16:  # a cause chain is short; never loop on a cycle
        fault = _fault_of(error)
        if fault is not None:
            return fault
        if wrapper is None and isinstance(error, StorageFullError):
            wrapper = StorageFault(error, error.message)
        error = error.__cause__ or error.__context__
        seen += 1
    return wrapper


def as_storage_full(error: BaseException, doing: str) -> StorageFullError | None:
    """``error`` as a :class:`~joynexus.errors.StorageFullError` (507) when the storage
    was full (None otherwise): what a layer raises ``from error`` so that callers and
    the HTTP answer see the fault, not a generic failure.

    Args:
        doing: What the write was for, e.g. "could not persist 1 training-job change".
    """
    fault = storage_full_cause(error)
    if fault is None:
        return None
    if isinstance(error, StorageFullError):
        return error
    where = f" writing {fault.filename}" if fault.filename else ""
    return StorageFullError(
        f"{doing}: {fault.reason}{where}; free disk space (or raise the quota) and retry"
    )
