"""Small file helpers shared by the layers that persist state (datasets, tenant stats)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

__all__ = ["STORAGE_FULL_ERRNOS", "atomic_write_bytes", "storage_full_cause"]

#: What a write answers when the disk (ENOSPC) or the user's quota (EDQUOT) is full.
STORAGE_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def storage_full_cause(error: BaseException | None) -> OSError | None:
    """The disk-full ``OSError`` behind ``error`` (itself, or along its causes: a
    wrapper may re-raise it), or None."""
    seen = 0
    while error is not None and seen < 16:  # a cause chain is short; never loop on a cycle
        if isinstance(error, OSError) and error.errno in STORAGE_FULL_ERRNOS:
            return error
        error = error.__cause__ or error.__context__
        seen += 1
    return None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file + rename (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
