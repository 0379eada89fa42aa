"""One server per run directory, and a run directory's database checked before use
(issue 28, items 9 and 10)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.control.integrity import check_run_dir_database
from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import RunDirInUseError, RunDirStateError
from joynexus.runtime.hosting import RuntimeConfig
from joynexus.runtime.plane import open_scheduler
from joynexus.utils.clock import FakeClock
from joynexus.utils.rundir_lock import RunDirLock

HOLD = """
import sys, time
from pathlib import Path
from joynexus.utils.rundir_lock import RunDirLock
RunDirLock(Path(sys.argv[1])).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def _holder(run_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_process_on_a_run_dir_is_refused_naming_the_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    try:
        with pytest.raises(RunDirInUseError) as info:
            RunDirLock(run_dir).acquire()
        assert f"process {holder.pid}" in str(info.value)
        assert info.value.details["pid"] == holder.pid
        # `joynexus serve` exits at once with that message (before loading any model:
        # the bogus base model would fail later with another message).
        result = CliRunner().invoke(
            app,
            [
                "serve",
                "--port",
                "0",
                "--run-dir",
                str(run_dir),
                "--base-model",
                "tiny:no-such-arch",
            ],
        )
        assert result.exit_code == 1, result.output
        assert f"in use by process {holder.pid}" in " ".join(result.output.split())
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: the kernel releases the lock
        holder.wait()
    with RunDirLock(run_dir) as lock:
        assert lock.held
        assert (run_dir / "joynexus.lock").read_text().strip() == str(os.getpid())
    # Released on exit: taken again at once (flock is per open file, so even in-process).
    first = RunDirLock(run_dir).acquire()
    with pytest.raises(RunDirInUseError):
        RunDirLock(run_dir).acquire()
    first.release()
    RunDirLock(run_dir).acquire().release()


def _checkpoint(run_dir: Path) -> None:
    step = run_dir / "outputs" / "alice" / "step_3"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text("{}")


@pytest.mark.parametrize("db_state", ["deleted", "zero-length"])
def test_records_without_their_database_are_refused_with_the_way_out(
    tmp_path: Path, db_state: str
) -> None:
    run_dir = tmp_path / "run"
    TrainingScheduler.open(run_dir / "scheduler.sqlite", clock=FakeClock()).close()
    _checkpoint(run_dir)
    db = run_dir / "scheduler.sqlite"
    if db_state == "deleted":
        db.unlink()
    else:
        db.write_bytes(b"")
    with pytest.raises(RunDirStateError) as info:
        open_scheduler(run_dir, RuntimeConfig(), FakeClock())
    text = str(info.value)
    assert "outputs/alice/step_3/manifest.json" in text
    assert "from a backup" in text and "move outputs/ aside" in text
    assert not db.exists() or db.stat().st_size == 0  # nothing was created over it


def test_a_new_or_sound_run_dir_opens(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    open_scheduler(run_dir, RuntimeConfig(), FakeClock()).close()  # new: created
    _checkpoint(run_dir)
    open_scheduler(run_dir, RuntimeConfig(), FakeClock()).close()  # sound: opens again


def _filled(run_dir: Path) -> Path:
    TrainingScheduler.open(run_dir / "scheduler.sqlite", clock=FakeClock()).close()
    db = run_dir / "scheduler.sqlite"
    conn = sqlite3.connect(db)
    with conn:  # some pages of rows to garble
        conn.execute("CREATE TABLE filler (i INTEGER PRIMARY KEY, s TEXT)")
        conn.executemany("INSERT INTO filler (s) VALUES (?)", [("x" * 200,)] * 400)
        conn.execute("CREATE INDEX filler_s ON filler (s)")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db


def test_garbled_pages_fail_the_integrity_check_at_start(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    db = _filled(run_dir)
    check_run_dir_database(run_dir)
    data = bytearray(db.read_bytes())
    page = 4096
    assert len(data) > 8 * page
    for offset in range(3 * page + 100, 6 * page, 7):  # inside b-tree pages, not the header
        data[offset] = (data[offset] + 0x5A) % 256
    db.write_bytes(bytes(data))
    with pytest.raises(RunDirStateError) as info:
        open_scheduler(run_dir, RuntimeConfig(), FakeClock())
    assert "integrity check" in str(info.value) and ".recover" in str(info.value)
    # A garbled header too ("file is not a database").
    data[0:16] = b"garbage garbage!"
    db.write_bytes(bytes(data))
    with pytest.raises(RunDirStateError, match="integrity check"):
        check_run_dir_database(run_dir)
