"""``examples/custom_reinforce.py`` runs against ``joynexus serve`` as the README starts it.

The server is the real command (``joynexus serve --run-dir ... --base-model
tiny:qwen2_5_vl``, a subprocess); the example runs as its own process with only
``JOYNEXUS_URL`` and a key in its environment.

Regressions:

* the example drove the model primitives only, with no way to reach the Training Queue
  or the Training Scheduler from the client, and needed ``--tenant`` although the key
  names the tenant. Every iteration is one scheduler job whose samples went through the
  Training Queue: the jobs are completed, the partitions cleared, and each update served;
* run with the key of a tenant whose ``rl`` workload had completed (the README's
  sequence: ``reach-ppo`` after the quickstart) it ended in ``APIError: 429
  quota_exceeded``; run with a new tenant it left that tenant with no served policy
  (404 "no model slot"), which only its docstring said. Given an admin key it now
  creates a tenant of its own; it leaves the tenant serving its trained policy (or says
  it cancelled it), and a used-up tenant or no key at all is one line saying what to
  pass.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from joynexus.client import APIError, Client
from tests.server.subproc import serve

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/custom_reinforce.py"


def _example(url: str, *args: str, **keys: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("JOYNEXUS_API_KEY", "JOYNEXUS_ADMIN_KEY")
    }
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        env={**env, "JOYNEXUS_URL": url, **keys},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _predict_version(url: str, key: str) -> int:
    with Client(url, key) as c:
        tenant = str(c.me()["tenant_id"])
        pred = c.predict(
            tenant, {"top": np.zeros((1, 32, 32, 3), np.uint8)}, np.zeros((1, 4), np.float32), ["x"]
        )
    return pred.policy_version


def test_custom_reinforce_runs_against_joynexus_serve(tmp_path: Path) -> None:
    with serve(tmp_path / "run", tmp_path / "serve.log") as srv:
        with Client(srv.url, srv.admin_key) as admin:
            key = admin.create_tenant("carol")["api_key"]
        done = _example(srv.url, "--iterations", "2", JOYNEXUS_API_KEY=key)
        assert done.returncode == 0, done.stdout + done.stderr + srv.log_tail()
        lines = re.findall(r"iter (\d): .* version (\d+) \(served (\d+)\)", done.stdout)
        assert lines == [("0", "1", "1"), ("1", "2", "2")], done.stdout

        with Client(srv.url, key) as carol:
            jobs = carol.jobs()
            assert [j["state"] for j in jobs] == ["completed", "completed"]
            assert all(j["consumer_role"] == "learner" for j in jobs)
            assert all(isinstance(j["metadata"]["loss"], float) for j in jobs)
            assert carol.partitions() == []  # every consumed partition was cleared
            (workload,) = carol.list_workloads()
        # The tenant keeps serving what it trained, and the example says so.
        assert workload.state.value == "running"
        assert (
            f"tenant carol serves policy version 2; workload {workload.workload_id} stays "
            "running" in done.stdout
        ), done.stdout
        assert _predict_version(srv.url, key) == 2


def test_it_gets_its_own_tenant_and_says_what_it_needs(tmp_path: Path) -> None:
    with serve(tmp_path / "run", tmp_path / "serve.log") as srv:
        # The README's sequence: reach-ppo's workload has completed its training target.
        with Client(srv.url, srv.admin_key) as admin:
            used = admin.create_tenant("reach-ppo")["api_key"]
        spec = yaml.safe_load((ROOT / "examples/workloads/rl-reach2d.yaml").read_text())
        spec["scheduling"]["completion_target"] = 1
        with Client(srv.url, used) as c:
            st = c.submit(spec)
            assert c.wait(st.workload_id, poll_s=0.1).state.value == "completed"
        refused = _example(srv.url, "--iterations", "1", JOYNEXUS_API_KEY=used)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert refused.stderr.strip() == (
            "error: tenant 'reach-ppo' has reached the training target of an earlier "
            "workload, so it takes no new RL jobs; run with an admin key (--admin-key or "
            "JOYNEXUS_ADMIN_KEY) and this example creates a tenant of its own"
        )

        # With the admin key beside that tenant key: a tenant of its own, trained.
        done = _example(
            srv.url,
            "--iterations",
            "1",
            "--cancel",
            JOYNEXUS_API_KEY=used,
            JOYNEXUS_ADMIN_KEY=srv.admin_key,
        )
        assert done.returncode == 0, done.stdout + done.stderr + srv.log_tail()
        created = re.search(
            r"created tenant (reinforce-[0-9a-f]{6}) \(API key: (\S+)\)", done.stdout
        )
        assert created is not None, done.stdout
        tenant, key = created.groups()
        assert f"tenant {tenant} has no served policy now" in done.stdout
        with Client(srv.url, key) as c:
            assert [w.state.value for w in c.list_workloads()] == ["cancelled"]
        try:
            _predict_version(srv.url, key)
        except APIError as exc:
            assert exc.status == 404, exc
        else:
            raise AssertionError("a cancelled tenant still served a policy")

        # The admin key as JOYNEXUS_API_KEY (as the README exports it for `tenants
        # create`) is recognised as one.
        done = _example(srv.url, "--iterations", "1", JOYNEXUS_API_KEY=srv.admin_key)
        assert done.returncode == 0, done.stdout + done.stderr + srv.log_tail()
        assert re.search(r"created tenant reinforce-[0-9a-f]{6} ", done.stdout), done.stdout

    nothing = _example("http://127.0.0.1:9", "--iterations", "1")
    assert nothing.returncode == 1
    assert nothing.stderr.strip().startswith("error: pass an admin key (--admin-key or ")
    assert len(nothing.stderr.strip().splitlines()) == 1
