"""``examples/quickstart.py`` (the README's Python example) runs as shipped, offline.

Regression: the README's snippet used an undefined ``spec``, ``cameras`` and ``state``
and a tenant that does not exist. The example runs its ``main`` here against a real
server (uvicorn on an ephemeral port, the tiny backbone built locally), the way the
README tells a user to run it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from joynexus.client import Client
from tests.server.livesrv import make_live, uvicorn_thread

ROOT = Path(__file__).resolve().parents[2]


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quickstart", ROOT / "examples/quickstart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["quickstart"] = module
    spec.loader.exec_module(module)
    return module


def test_quickstart_runs_against_a_server(
    tmp_path: Path, tiny_model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    example = _example()
    srv = make_live(tmp_path / "run", tiny_model)
    admin = srv.tenants.create_admin_key().api_key
    with uvicorn_thread(srv.app) as url:
        with Client(url, admin) as c:
            key = c.create_tenant("reach-ppo")["api_key"]  # the tenant the spec names
        args = ["--url", url, "--api-key", key, "--base-model", tiny_model, "--updates", "2"]
        result = example.main(args)
    out = capsys.readouterr().out
    assert "completed, policy version" in out and "-> actions [1, " in out
    assert result.workload.state.value == "completed"
    assert result.workload.jobs_completed >= 2
    chunk, action_dim = result.actions.shape[1:]
    assert result.actions.shape[0] == 1 and action_dim == 2 and chunk >= 1
    assert result.policy_version >= 2
