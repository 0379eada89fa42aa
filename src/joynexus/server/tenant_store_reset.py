"""Start a new tenant store over a lost or damaged one (``joynexus tenants new-store``).

``joynexus serve`` refuses a run directory whose ``tenants.sqlite`` is missing, empty
or damaged while workloads, checkpoints or an admin key exist
(:func:`joynexus.control.integrity.check_tenant_store`). The first way out is a backup
of the file. Without one, the operator asks for a new store explicitly: the old store
and the old admin key file are kept aside (renamed, never deleted), a new store and a
new admin key are written, and the tenants the run directory knows are listed so the
admin re-creates them (``joynexus tenants create``) and hands out their new keys. Their
workloads and checkpoints are keyed by tenant id, so a re-created tenant finds them.
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from joynexus.control.integrity import DATABASE_FILE, TENANT_STORE_FILE, check_tenant_store
from joynexus.errors import ConflictError, RunDirStateError
from joynexus.server.auth import TenantStore
from joynexus.server.names import TENANT_PATTERN
from joynexus.utils.rundir_lock import RunDirLock

__all__ = ["NewTenantStore", "start_new_tenant_store"]

#: Files SQLite may keep beside the store; they go aside with it.
_SIDECARS = ("-journal", "-wal", "-shm")


@dataclass(frozen=True, slots=True)
class NewTenantStore:
    """What :func:`start_new_tenant_store` did.

    Attributes:
        store: The new ``tenants.sqlite``.
        admin_key_file: The file holding the new admin key (mode 0600).
        kept_aside: The old files, renamed (a restore from them stays possible).
        tenants: Tenant ids the run directory holds workloads or checkpoints of, to
            re-create.
    """

    store: Path
    admin_key_file: Path
    kept_aside: list[Path]
    tenants: list[str]


def start_new_tenant_store(run_dir: Path, *, admin_key_file: Path) -> NewTenantStore:
    """Replace a lost or damaged tenant store of ``run_dir`` with a new, empty one.

    Args:
        run_dir: A server's run directory (no server may run on it).
        admin_key_file: Where the server keeps its admin key (``--admin-key-file``).

    Raises:
        RunDirInUseError: a server runs on ``run_dir``.
        ConflictError: the tenant store is sound (or the run directory is new): there
            is nothing to replace.
    """
    from joynexus.server.serve import ensure_admin_key

    run_dir = Path(run_dir)
    with RunDirLock(run_dir):
        try:
            check_tenant_store(run_dir, admin_key_file=admin_key_file)
        except RunDirStateError:
            pass  # lost or damaged: replaced below
        else:
            raise ConflictError(
                f"the tenant store of {run_dir} is sound (or the run directory is new): "
                "nothing to replace; `joynexus serve` opens it as it is",
                run_dir=str(run_dir),
            )
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        db = run_dir / TENANT_STORE_FILE
        aside = [
            p
            for p in (db, *(db.with_name(db.name + s) for s in _SIDECARS), Path(admin_key_file))
            if p.exists()
        ]
        kept = [p.rename(p.with_name(f"{p.name}.lost-{stamp}")) for p in aside]
        store = TenantStore.open(db)
        try:
            ensure_admin_key(store, Path(admin_key_file))
        finally:
            store.close()
        return NewTenantStore(db, Path(admin_key_file), kept, _known_tenants(run_dir))


def _known_tenants(run_dir: Path) -> list[str]:
    """Tenant ids with workload records or outputs in ``run_dir``, sorted."""
    found: set[str] = set()
    outputs = run_dir / "outputs"
    if outputs.is_dir():
        found.update(
            p.name for p in outputs.iterdir() if p.is_dir() and re.fullmatch(TENANT_PATTERN, p.name)
        )
    db = run_dir / DATABASE_FILE
    if db.is_file():
        try:
            conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
            try:
                rows = conn.execute("SELECT DISTINCT tenant_id FROM workloads").fetchall()
            finally:
                conn.close()
            found.update(str(r[0]) for r in rows)
        except sqlite3.Error:
            pass  # no workload table yet (or a database serve will refuse on its own)
    return sorted(found)
