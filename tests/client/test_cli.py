"""The client CLI commands against a live server (url + key from env vars)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.wire import unpackb
from tests.server.livesrv import make_live, reach_custom, uvicorn_thread


def test_cli_round_trip(tmp_path: Path, tiny_model: str) -> None:
    srv = make_live(tmp_path / "run", tiny_model)
    admin = srv.tenants.create_admin_key().api_key
    runner = CliRunner()
    with uvicorn_thread(srv.app) as url:
        env = {"JOYNEXUS_URL": url, "JOYNEXUS_API_KEY": admin}
        out = runner.invoke(app, ["tenants", "create", "alice"], env=env)
        assert out.exit_code == 0, out.output
        key = re.search(r"(jnx_\S+)", out.output.replace("\n", ""))
        assert key is not None
        out = runner.invoke(app, ["tenants", "list"], env=env)
        assert "alice" in out.output

        env["JOYNEXUS_API_KEY"] = key.group(1)
        spec = tmp_path / "custom.yaml"
        spec.write_text(yaml.safe_dump(reach_custom("alice", tiny_model)))
        out = runner.invoke(app, ["submit", str(spec)], env=env)
        assert out.exit_code == 0, out.output
        wid = re.search(r"(wl-\S+)", out.output)
        assert wid is not None
        workload = wid.group(1)
        out = runner.invoke(app, ["status", workload, "--once"], env=env)
        assert out.exit_code == 0 and "custom" in out.output, out.output
        out = runner.invoke(app, ["logs", workload], env=env)
        assert out.exit_code == 0 and "lifecycle" in out.output, out.output
        out = runner.invoke(app, ["artifacts", workload], env=env)
        assert "workload.json" in out.output, out.output
        target = tmp_path / "alice.msgpack"
        out = runner.invoke(app, ["export", "alice", "--out", str(target)], env=env)
        assert out.exit_code == 0, out.output
        assert unpackb(target.read_bytes())["manifest"]["tenant_id"] == "alice"
        out = runner.invoke(app, ["export", "bob", "--out", str(target)], env=env)
        assert out.exit_code == 1 and "permission_denied" in out.output
        out = runner.invoke(app, ["cancel", workload], env=env)
        assert out.exit_code == 0 and "cancelled" in out.output, out.output


def test_serve_with_an_unavailable_runtime_says_so(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        app, ["serve", "--port", "0", "--runtime", "nope", "--run-dir", str(tmp_path)]
    )
    assert out.exit_code == 1 and "local" in out.output
