"""One server per run directory: an exclusive ``flock`` on ``<run_dir>/joynexus.lock``.

Two processes on one run directory would both resume its live workloads, fail each
other's jobs and issue duplicate ``created_seq`` values. The lock is an advisory
``fcntl.flock`` on a file that records the holder's PID: the kernel releases it when
the holder exits in any way (``kill -9`` included), so a crashed server never leaves
a stale lock behind, and a second process learns at once who holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType

from joynexus.errors import RunDirInUseError

__all__ = ["LOCK_FILE", "RunDirLock"]

LOCK_FILE = "joynexus.lock"


class RunDirLock:
    """The exclusive lock of a run directory (see module docstring).

    Args:
        run_dir: The run directory (created if missing).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunDirLock:
        """Take the lock without waiting.

        Raises:
            RunDirInUseError: another process holds it (the message names its PID).
        """
        if self._fd is not None:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"process {holder}" if holder is not None else "another process"
            raise RunDirInUseError(
                f"run directory {self.run_dir} is in use by {who} (a `joynexus serve` or "
                "`joynexus run` on it); stop that process first, or pass another --run-dir",
                run_dir=str(self.run_dir),
                pid=holder,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        # Ours now: record our PID for the next process that finds it taken.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (idempotent); the file stays, its PID is stale but harmless."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
