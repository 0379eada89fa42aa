"""A lost or damaged ``tenants.sqlite`` beside existing state is refused at start
(issue 43, item 5): before, a deleted store opened empty and every key answered 401."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.control.integrity import check_tenant_store
from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import RunDirStateError
from joynexus.server.auth import TenantStore
from joynexus.server.serve import ensure_admin_key
from joynexus.utils.clock import FakeClock


def _served(run_dir: Path) -> tuple[Path, str]:
    """A run directory a server ran in: its tenant store with an admin key and a
    tenant, the scheduler database, a checkpoint. Returns (admin key file, tenant key)."""
    key_file = run_dir / "admin.key"
    store = TenantStore.open_run_dir(run_dir, admin_key_file=key_file)
    assert ensure_admin_key(store, key_file)
    store.create_tenant("alice")
    tenant_key = store.create_key("alice").api_key
    store.close()
    TrainingScheduler.open(run_dir / "scheduler.sqlite", clock=FakeClock()).close()
    step = run_dir / "outputs" / "alice" / "step_3"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text("{}")
    return key_file, tenant_key


def _garble(db: Path) -> None:
    data = bytearray(db.read_bytes())
    data[0:16] = b"garbage garbage!"  # the header: "file is not a database"
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["deleted", "zero-length", "garbled", "recreated empty"])
def test_a_lost_or_damaged_tenant_store_is_refused_with_the_way_out(
    tmp_path: Path, damage: str
) -> None:
    run_dir = tmp_path / "run"
    key_file, _ = _served(run_dir)
    db = run_dir / "tenants.sqlite"
    if damage == "deleted":
        db.unlink()
    elif damage == "zero-length":
        db.write_bytes(b"")
    elif damage == "garbled":
        _garble(db)
    else:  # what the old code left behind: a new empty store beside the old key file
        db.unlink()
        TenantStore.open(db).close()
    before = db.read_bytes() if db.exists() else None
    with pytest.raises(RunDirStateError) as info:
        TenantStore.open_run_dir(run_dir, admin_key_file=key_file)
    text = str(info.value)
    assert "from a backup" in text and f"joynexus tenants new-store --run-dir {run_dir}" in text
    # Nothing was created or changed over what is left of it.
    assert (db.read_bytes() if db.exists() else None) == before


def test_each_kind_of_existing_state_counts(tmp_path: Path) -> None:
    for name, make in {
        "database": lambda d: TrainingScheduler.open(
            d / "scheduler.sqlite", clock=FakeClock()
        ).close(),
        "admin key": lambda d: (d / "admin.key").write_text("jnx_x_y\n"),
        "workload record": lambda d: (
            (d / "outputs/alice/workloads/wl-1").mkdir(parents=True),
            (d / "outputs/alice/workloads/wl-1/workload.json").write_text("{}"),
        ),
    }.items():
        run_dir = tmp_path / name.replace(" ", "-")
        run_dir.mkdir()
        make(run_dir)
        with pytest.raises(RunDirStateError, match="is missing"):
            check_tenant_store(run_dir, admin_key_file=run_dir / "admin.key")


def test_a_new_or_sound_run_dir_opens(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    key_file, tenant_key = _served(run_dir)  # new: created (inside _served)
    store = TenantStore.open_run_dir(run_dir, admin_key_file=key_file)  # sound: opens again
    try:
        admin = store.authenticate(key_file.read_text().strip())
        assert admin is not None and admin.role == "admin"
        who = store.authenticate(tenant_key)
        assert who is not None and who.tenant_id == "alice"
    finally:
        store.close()


def test_serve_exits_with_the_message_and_no_traceback(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _served(run_dir)
    (run_dir / "tenants.sqlite").unlink()
    result = CliRunner().invoke(app, ["serve", "--port", "0", "--run-dir", str(run_dir)])
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert "tenant store tenants.sqlite" in out and "is missing" in out
    assert "joynexus tenants new-store" in out and "Traceback" not in out
    assert not (run_dir / "tenants.sqlite").exists()
