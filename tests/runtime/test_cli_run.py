from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.services.env_worker import SimulatorWorker


def test_joynexus_run_writes_the_summary(tmp_path: Path, tiny_model: str) -> None:
    spec = {
        "tenant": "cli-rl",
        "task": "rl",
        "base_model": {"id": tiny_model},
        "env": {"kind": "reach2d", "num_envs": 2, "image_size": 32, "max_episode_steps": 4},
        "action_module": {"type": "oft", "hidden_dim": 32, "num_blocks": 1},
        "algorithm": {"name": "ppo", "horizon": 4, "microbatch_size": 8},
        "scheduling": {"completion_target": 1, "max_in_flight": 1},
        "output_dir": "out",
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(
        app, ["run", str(path), "--json", str(out), "--run-dir", str(tmp_path / "run")]
    )
    assert result.exit_code == 0, result.output
    # Not a terminal: a plain progress line per change instead of live bars.
    assert "cli-rl rl: 0/" in result.output and " done" in result.output, result.output
    doc = json.loads(out.read_text())
    entry = doc["cli-rl"]
    assert entry["task"] == "rl" and entry["jobs_completed"] >= 1
    assert entry["final_version"] >= 1 and "rl_return_initial" in entry
    # Outputs live in the run directory, next to the job history (the spec's
    # output_dir is ignored): one workload's records per workload id.
    assert entry["output_dir"] == str(tmp_path / "run" / "outputs" / "cli-rl")
    assert list((tmp_path / "run" / "outputs" / "cli-rl" / "workloads").glob("*/metrics.jsonl"))
    assert not (tmp_path / "out").exists()


def test_joynexus_run_rejects_a_bad_spec_before_starting(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tenant": "x",
                "task": "rl",
                "base_model": {"id": "tiny:qwen2_5_vl"},
                "env": {"kind": "no-such-env"},
                "algorithm": {"name": "ppo"},
            }
        )
    )
    result = CliRunner().invoke(app, ["run", str(path), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "known kinds" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs os.sched_setaffinity and at least 2 usable cores",
)
def test_joynexus_run_pins_the_device_and_the_simulator_workers(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cores = set(os.sched_getaffinity(0))
    device = min(cores)
    # (worker's cores, the starting thread's) per start: the host, which keeps every core
    seen: list[tuple[set[int], set[int]]] = []
    start = SimulatorWorker.start.__func__  # type: ignore[attr-defined]

    async def spy(cls: type[SimulatorWorker], *args: Any, **kwargs: Any) -> tuple[Any, str]:
        worker, schema = await start(cls, *args, **kwargs)
        seen.append((os.sched_getaffinity(worker.process.pid), os.sched_getaffinity(0)))
        return worker, schema

    monkeypatch.setattr(SimulatorWorker, "start", classmethod(spy))
    spec = {
        "tenant": "pinned",
        "task": "rl",
        "base_model": {"id": tiny_model},
        "env": {"kind": "reach2d", "num_envs": 1, "image_size": 32, "max_episode_steps": 4},
        "action_module": {"type": "oft", "hidden_dim": 32, "num_blocks": 1},
        "algorithm": {"name": "ppo", "horizon": 4, "microbatch_size": 4},
        "scheduling": {"completion_target": 1, "max_in_flight": 1},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(
        app,
        ["run", str(path), "--run-dir", str(tmp_path / "run"), "--device-cores", str(device)],
    )
    assert result.exit_code == 0, result.output
    assert f"model services (the device) on cores {device}, simulator workers" in result.output
    assert seen and all(w == cores - {device} and host == cores for w, host in seen), seen
    assert os.sched_getaffinity(0) == cores  # given back at the end
