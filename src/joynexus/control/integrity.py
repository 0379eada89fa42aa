"""Start-up checks of a run directory's databases (``scheduler.sqlite``, ``tenants.sqlite``).

The database holds the job history and the workload records; the checkpoints and
workload folders under ``outputs/`` only make sense with it. Opening a missing or
zero-length database silently creates an empty one — a fresh service that forgets
every workload while their checkpoints sit on disk — and SQLite opens a file with
garbled pages without complaint until a query reaches them. So before the scheduler
opens it: a run directory whose checkpoints or workload records exist without its
database is refused, and an existing database must pass ``PRAGMA integrity_check``.
Each refusal says how to recover.

``joynexus serve`` keeps its tenants and their hashed API keys in ``tenants.sqlite``.
Losing it is as silent: a new empty store opens, the admin key file is kept (so no new
admin key is written) and every key, the admin's included, answers 401 while the
tenants' workloads and checkpoints remain. :func:`check_tenant_store` refuses that start
the same way.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from joynexus.errors import RunDirStateError

__all__ = [
    "DATABASE_FILE",
    "NEW_TENANT_STORE_COMMAND",
    "TENANT_STORE_FILE",
    "check_run_dir_database",
    "check_tenant_store",
    "run_dir_records",
]

DATABASE_FILE = "scheduler.sqlite"
TENANT_STORE_FILE = "tenants.sqlite"
#: How a refusal of the tenant store says to start a new one (``joynexus.cli.tenant_store``).
NEW_TENANT_STORE_COMMAND = "joynexus tenants new-store --run-dir"
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


def check_tenant_store(run_dir: Path, *, admin_key_file: Path) -> None:
    """Refuse to serve a run directory whose tenant store is lost or damaged.

    The store is lost when ``tenants.sqlite`` is missing or zero-length while the run
    directory holds state a tenant store belonged to: the scheduler database, checkpoint
    or workload records, or the admin key file. It is damaged when it fails SQLite's
    integrity check, has no ``api_keys`` table, or holds no admin key while the admin key
    file exists (an empty store opened over a lost one). A new run directory passes: the
    server creates the store and its first admin key.

    Args:
        run_dir: The server's run directory (``tenants.sqlite`` lives there).
        admin_key_file: Where the server keeps its admin key (``--admin-key-file``).

    Raises:
        RunDirStateError: the store is lost or damaged (the message says how to recover).
    """
    run_dir = Path(run_dir)
    db = run_dir / TENANT_STORE_FILE
    exists = db.is_file()
    new_store = f"`{NEW_TENANT_STORE_COMMAND} {run_dir}`"
    if not exists or db.stat().st_size == 0:
        state = _served_state(run_dir, admin_key_file)
        if not state:
            return
        what = "is empty (zero length)" if exists else "is missing"
        raise RunDirStateError(
            f"tenant store {TENANT_STORE_FILE} of run directory {run_dir} {what}, but the "
            f"directory holds {', '.join(state)}: starting would answer 401 to the admin key "
            "and every tenant key while their workloads and checkpoints remain. Restore "
            f"{TENANT_STORE_FILE} from a backup; or, to start a new tenant store (a new "
            f"admin key; every tenant re-created and its keys re-issued), run {new_store}",
            run_dir=str(run_dir),
            database=str(db),
            state=state,
        )
    problems = _integrity_problems(db) or _tenant_store_problems(db, admin_key_file)
    if problems:
        shown = "; ".join(problems[:_SHOWN])
        raise RunDirStateError(
            f"tenant store {db} is damaged: {shown}. Stop every process on {run_dir}, then "
            f"restore {TENANT_STORE_FILE} from a backup; or, to start a new tenant store (a "
            f"new admin key; every tenant re-created and its keys re-issued), run {new_store}",
            database=str(db),
            problems=problems[: _SHOWN * 4],
        )


def _served_state(run_dir: Path, admin_key_file: Path) -> list[str]:
    """What in ``run_dir`` shows a server ran there (empty: a new run directory)."""
    found: list[str] = []
    db = run_dir / DATABASE_FILE
    if db.exists() or db.with_name(f"{DATABASE_FILE}-wal").exists():
        found.append(f"the database {DATABASE_FILE}")
    records = run_dir_records(run_dir)
    if records:
        found.append(
            f"{len(records)} checkpoint or workload records (e.g. "
            f"{records[0].relative_to(run_dir)})"
        )
    if Path(admin_key_file).exists():
        found.append(f"the admin key file {admin_key_file}")
    return found


def _tenant_store_problems(db: Path, admin_key_file: Path) -> list[str]:
    """What makes a sound SQLite file not this run directory's tenant store."""
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return [f"cannot open: {exc}"]
    try:
        admins = conn.execute("SELECT count(*) FROM api_keys WHERE role = 'admin'").fetchone()[0]
    except sqlite3.DatabaseError as exc:  # "no such table": some other database
        return [f"it is not a tenant store ({exc})"]
    finally:
        conn.close()
    if admins == 0 and Path(admin_key_file).exists():
        return [
            f"it holds no admin key while the admin key file {admin_key_file} exists (it "
            "was created empty over a lost store)"
        ]
    return []


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
