"""Start-up check of a run directory's database (``scheduler.sqlite``).

The database holds the job history and the workload records; the checkpoints and
workload folders under ``outputs/`` only make sense with it. Opening a missing or
zero-length database silently creates an empty one — a fresh service that forgets
every workload while their checkpoints sit on disk — and SQLite opens a file with
garbled pages without complaint until a query reaches them. So before the scheduler
opens it: a run directory whose checkpoints or workload records exist without its
database is refused, and an existing database must pass ``PRAGMA integrity_check``.
Each refusal says how to recover.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from joynexus.errors import RunDirStateError

__all__ = ["DATABASE_FILE", "check_run_dir_database", "run_dir_records"]

DATABASE_FILE = "scheduler.sqlite"
#: Problems listed in a refusal (integrity_check can report thousands).
_SHOWN = 5


def run_dir_records(run_dir: Path) -> list[Path]:
    """What under ``run_dir/outputs`` needs the database: checkpoint manifests
    (``<tenant>/step_<n>/manifest.json``) and workload records
    (``<tenant>/workloads/<id>/workload.json``), sorted."""
    outputs = Path(run_dir) / "outputs"
    if not outputs.is_dir():
        return []
    found = [
        *outputs.glob("*/step_*/manifest.json"),
        *outputs.glob("*/workloads/*/workload.json"),
    ]
    return sorted(found)


def check_run_dir_database(run_dir: Path) -> None:
    """Refuse a run directory whose database is missing, empty or damaged.

    A new run directory (no database and nothing under ``outputs/``) passes: the
    scheduler creates the database.

    Raises:
        RunDirStateError: records exist without the database, or the database fails
            SQLite's integrity check (the message says how to recover).
    """
    run_dir = Path(run_dir)
    db = run_dir / DATABASE_FILE
    exists = db.is_file()
    empty = exists and db.stat().st_size == 0
    if not exists or empty:
        records = run_dir_records(run_dir)
        if not records:
            return
        what = "is empty (zero length)" if empty else "is missing"
        example = records[0].relative_to(run_dir)
        raise RunDirStateError(
            f"run directory {run_dir} holds {len(records)} checkpoint or workload records "
            f"(e.g. {example}) but its database {DATABASE_FILE} {what}: starting would "
            "forget every workload. Restore "
            f"{DATABASE_FILE} (with its -wal file) from a backup; or, to start a fresh "
            "service, move outputs/ aside or pass another --run-dir (a kept checkpoint "
            "can still seed a new workload through init_from)",
            run_dir=str(run_dir),
            database=str(db),
            records=len(records),
        )
    problems = _integrity_problems(db)
    if problems:
        shown = "; ".join(problems[:_SHOWN])
        more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
        raise RunDirStateError(
            f"database {db} failed SQLite's integrity check: {shown}{more}. Stop every "
            f"process on {run_dir}, then restore {DATABASE_FILE} from a backup, or "
            f"salvage it with `sqlite3 {DATABASE_FILE} .recover | sqlite3 recovered.sqlite` "
            f"and put recovered.sqlite in its place",
            database=str(db),
            problems=problems[: _SHOWN * 4],
        )


def _integrity_problems(db: Path) -> list[str]:
    """SQLite's ``integrity_check`` findings (empty: the database is sound)."""
    try:
        # Read-only: the check must never be what changes the file it examines.
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return [f"cannot open: {exc}"]
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.DatabaseError as exc:  # e.g. a garbled header: "file is not a database"
        return [str(exc)]
    finally:
        conn.close()
    found = [str(r[0]) for r in rows]
    return [] if found == ["ok"] else found
