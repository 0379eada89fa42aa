"""``joynexus tenants new-store``: the explicit way to a new tenant store when no backup
of a lost one exists (issue 43, item 5)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.control.scheduler import TrainingScheduler
from joynexus.server.auth import TenantStore
from joynexus.server.serve import ensure_admin_key
from joynexus.utils.clock import FakeClock


def _served(run_dir: Path) -> Path:
    key_file = run_dir / "admin.key"
    store = TenantStore.open_run_dir(run_dir, admin_key_file=key_file)
    ensure_admin_key(store, key_file)
    store.create_tenant("alice")
    store.close()
    TrainingScheduler.open(run_dir / "scheduler.sqlite", clock=FakeClock()).close()
    for tenant in ("alice", "bob"):
        step = run_dir / "outputs" / tenant / "step_1"
        step.mkdir(parents=True)
        (step / "manifest.json").write_text("{}")
    return key_file


def test_new_store_keeps_the_old_files_aside_and_lists_the_tenants(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    key_file = _served(run_dir)
    old_key = key_file.read_text()
    (run_dir / "tenants.sqlite").write_bytes(b"")  # lost
    result = CliRunner().invoke(app, ["tenants", "new-store", "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "joynexus tenants create alice" in out and "joynexus tenants create bob" in out
    aside = sorted(p.name for p in run_dir.glob("*.lost-*"))
    assert [n.split(".lost-")[0] for n in aside] == ["admin.key", "tenants.sqlite"]
    assert (run_dir / aside[0]).read_text() == old_key
    new_key = key_file.read_text().strip()
    assert new_key != old_key.strip()
    # The store now passes the start-up check, and the new admin key is its admin.
    store = TenantStore.open_run_dir(run_dir, admin_key_file=key_file)
    try:
        who = store.authenticate(new_key)
        assert who is not None and who.role == "admin"
        assert store.list_tenants() == []
    finally:
        store.close()


def test_new_store_refuses_to_replace_a_sound_store(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    key_file = _served(run_dir)
    before = (run_dir / "tenants.sqlite").read_bytes()
    result = CliRunner().invoke(app, ["tenants", "new-store", "--run-dir", str(run_dir)])
    assert result.exit_code == 1, result.output
    assert "nothing to replace" in " ".join(result.output.split())
    assert (run_dir / "tenants.sqlite").read_bytes() == before
    assert not list(run_dir.glob("*.lost-*")) and key_file.exists()
