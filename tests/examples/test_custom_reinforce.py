"""``examples/custom_reinforce.py`` runs against ``joynexus serve`` as the README starts it.

The server is the real command (``joynexus serve --run-dir ... --base-model
tiny:qwen2_5_vl``, a subprocess); the tenant is created with the admin key and the
example runs as its own process with only ``JOYNEXUS_URL`` and ``JOYNEXUS_API_KEY``.
Regression: the example drove the model primitives only, with no way to reach the
Training Queue or the Training Scheduler from the client, and needed ``--tenant``
although the key names the tenant. Now every iteration is one scheduler job whose
samples went through the Training Queue: the jobs are completed, the partitions
cleared, and each update served.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from joynexus.client import Client
from tests.server.subproc import serve

ROOT = Path(__file__).resolve().parents[2]


def test_custom_reinforce_runs_against_joynexus_serve(tmp_path: Path) -> None:
    with serve(tmp_path / "run", tmp_path / "serve.log") as srv:
        with Client(srv.url, srv.admin_key) as admin:
            key = admin.create_tenant("carol")["api_key"]
        env = {**os.environ, "JOYNEXUS_URL": srv.url, "JOYNEXUS_API_KEY": key}
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples/custom_reinforce.py"), "--iterations", "2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr + srv.log_tail()
        lines = re.findall(r"iter (\d): .* version (\d+) \(served (\d+)\)", done.stdout)
        assert lines == [("0", "1", "1"), ("1", "2", "2")], done.stdout

        with Client(srv.url, key) as carol:
            jobs = carol.jobs()
            assert [j["state"] for j in jobs] == ["completed", "completed"]
            assert all(j["consumer_role"] == "learner" for j in jobs)
            assert all(isinstance(j["metadata"]["loss"], float) for j in jobs)
            assert carol.partitions() == []  # every consumed partition was cleared
            assert [w.state.value for w in carol.list_workloads()] == ["cancelled"]
