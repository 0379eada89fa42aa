"""``examples/quickstart.py`` (the README's Python example) runs as shipped, offline.

Regression: the README's snippet used an undefined ``spec``, ``cameras`` and ``state``
and a tenant that does not exist. The example runs its ``main`` here against a real
server (uvicorn on an ephemeral port, the tiny backbone built locally), the way the
README tells a user to run it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from joynexus.client import Client
from tests.server.livesrv import make_live, uvicorn_thread

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_runs_against_a_server(tmp_path: Path, tiny_model: str) -> None:
    srv = make_live(tmp_path / "run", tiny_model)
    admin = srv.tenants.create_admin_key().api_key
    with uvicorn_thread(srv.app) as url:
        with Client(url, admin) as c:
            key = c.create_tenant("reach-ppo")["api_key"]  # the tenant the spec names
        # As a user runs it: its own process, the server's URL and key in the environment.
        env = {**os.environ, "JOYNEXUS_URL": url, "JOYNEXUS_API_KEY": key}
        done = subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples/quickstart.py"),
                "--updates",
                "2",
                "--base-model",
                tiny_model,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    final = re.search(r": completed, policy version (\d+)", out)
    assert final is not None and int(final.group(1)) >= 2, out
    shape = re.search(r"-> actions \[1, (\d+), 2\] \(policy version (\d+)\)", out)
    assert shape is not None and int(shape.group(1)) >= 1, out
    assert int(shape.group(2)) >= 2, out  # the trained policy served the prediction
