"""``pause``, ``resume``, ``load-weights`` and ``status`` against a live server.

Regressions: the CLI had no ``pause``, ``resume`` or ``load_weights`` (the client and
the server had them); ``joynexus status`` into a pipe printed nothing while a workload
ran (a live display only redraws on a terminal) and showed no evaluation results (nor
the seeds they were measured on).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.client import Client
from tests.server.livesrv import make_live, reach_custom, reach_rl, uvicorn_thread


def _eval_spec(tenant: str, model: str, target: str) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "task": "eval",
        "base_model": {"id": model},
        "env": {"kind": "reach2d", "num_envs": 2, "image_size": 32, "max_episode_steps": 4},
        "action_module": {"type": "oft", "hidden_dim": 32, "num_blocks": 1},
        "evaluation": {
            "targets": [target],
            "seeds": {"start": 4242, "count": 2},
            "interval_s": 0.01,
            "runs": 1,
        },
    }


def test_pause_resume_load_weights_and_piped_status(tmp_path: Path, tiny_model: str) -> None:
    srv = make_live(tmp_path / "run", tiny_model)
    admin = srv.tenants.create_admin_key().api_key
    runner = CliRunner()
    with uvicorn_thread(srv.app) as url:
        with Client(url, admin) as c:
            keys = {t: c.create_tenant(t)["api_key"] for t in ("alice", "bob", "carol")}
        env = {"JOYNEXUS_URL": url, "JOYNEXUS_API_KEY": keys["alice"]}
        with Client(url, keys["alice"]) as alice:
            # A target it will not reach during the test: it stays live (paused, running).
            wid = alice.submit(reach_rl("alice", tiny_model, target=10_000)).workload_id
            alice.wait(wid, states=["running"], poll_s=0.05, timeout_s=120)
        with Client(url, keys["carol"]) as carol:  # a slot that only load-weights changes
            slot = carol.submit(reach_custom("carol", tiny_model)).workload_id
            carol.wait(slot, states=["running"], poll_s=0.05, timeout_s=120)

        out = runner.invoke(app, ["pause", wid], env=env)
        assert out.exit_code == 0 and f"{wid}: paused" in out.output, out.output

        carol_env = {**env, "JOYNEXUS_API_KEY": keys["carol"]}
        exported = tmp_path / "carol.msgpack"
        out = runner.invoke(app, ["export", "carol", "--out", str(exported)], env=carol_env)
        assert out.exit_code == 0, out.output
        for name, version in (("load-weights", "6"), ("load_weights", "7")):
            out = runner.invoke(
                app, [name, "carol", str(exported), "--version", version], env=carol_env
            )
            assert out.exit_code == 0, out.output
            assert f"carol: serving version {version}" in out.output, out.output
        out = runner.invoke(
            app, ["load-weights", "bob", str(exported), "--version", "8"], env=carol_env
        )
        assert out.exit_code == 1 and "error:" in out.output, out.output
        garbage = tmp_path / "garbage.bin"
        garbage.write_bytes(b"\xc1 not msgpack")
        out = runner.invoke(app, ["load-weights", "carol", str(garbage)], env=carol_env)
        assert out.exit_code != 0 and "joynexus export" in out.output, out.output

        # Carol evaluates the policy she published; status shows the result.
        spec = tmp_path / "eval.yaml"
        spec.write_text(yaml.safe_dump(_eval_spec("carol", tiny_model, "carol")))
        out = runner.invoke(app, ["submit", str(spec)], env=carol_env)
        assert out.exit_code == 0, out.output
        with Client(url, keys["carol"]) as carol:
            ev = next(w for w in carol.list_workloads() if w.task == "eval")
            done = carol.wait(ev.workload_id, poll_s=0.05, timeout_s=180)
            assert done.state.value == "completed", done
            (record,) = carol.metrics(ev.workload_id, kind="eval").records
            assert record["seeds"] == [4242, 4243]  # the declared evaluation seeds, recorded

        # Into a pipe, with Alice's workload still live (paused) and no --once: one table.
        cmd = [str(Path(sys.executable).with_name("joynexus")), "status"]
        piped = subprocess.run(
            cmd,
            env={**os.environ, **env, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert piped.returncode == 0, piped.stderr
        assert wid in piped.stdout and "paused" in piped.stdout, piped.stdout
        out = runner.invoke(app, ["status", "--once"], env={**carol_env, "COLUMNS": "200"})
        assert out.exit_code == 0, out.output
        assert re.search(
            r"carol \d\.\d\d \[\d\.\d\d, \d\.\d\d\] @v7 seeds 4242\.\.4243", out.output
        ), out.output

        out = runner.invoke(app, ["resume", wid], env=env)
        assert out.exit_code == 0 and f"{wid}: running" in out.output, out.output
        out = runner.invoke(app, ["cancel", wid], env=env)
        assert out.exit_code == 0 and f"{wid}: cancelled" in out.output, out.output
