"""scripts/gpu-bench.sh: its dry run (CPU, tiny sizes) takes the GPU run's code path and
writes every bench's JSON; the 3B-class size it builds for the GPU is 2-4B parameters.

The serving step is skipped here (it starts one server per tenant plus the shared one,
~30 s on 2 cores); tests/bench/test_serving.py covers that bench.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from joynexus.models import tiny

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-bench.sh"


@pytest.mark.timeout(660)
def test_dry_run_writes_every_bench_json(tmp_path: Path) -> None:
    out = tmp_path / "gpu-bench"
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--skip", "serving", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # a few seconds a step when idle; generous for a loaded CI machine
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mode"] == "dry-run" and manifest["device"] == "cpu"
    status = {s["name"]: s["status"] for s in manifest["steps"]}
    assert status == {
        "make-model-tiny": "ok",
        "group-batching-small": "ok",
        "group-batching-3b": "ok",
        "lora": "ok",
        "serving": "skipped",
        "canonicalize": "ok",
        "pi0": "ok",
    }
    for name in ("group-batching-small", "group-batching-3b", "pi0"):
        doc = json.loads((out / f"{name}.json").read_text())
        assert doc["config"]["device"] == "cpu" and doc["grid"], name
    canon = json.loads((out / "canonicalize.json").read_text())
    assert canon["config"]["device"] == "cpu" and canon["arches"]["qwen2_5_vl"]["equal"]
    lora = json.loads((out / "lora.json").read_text())
    assert isinstance(lora, dict) and lora
    assert not (out / ".models").exists()  # the built models are removed at the end


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    for args in (["--bogus"], ["--skip"], [str(tmp_path / "a"), str(tmp_path / "b")]):
        proc = subprocess.run(
            ["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)


def test_3b_size_is_a_3b_class_model() -> None:
    assert "3b" in tiny.SIZES
    with torch.device("meta"):  # the shapes only: nothing allocated
        model, _ = tiny._BUILDERS["qwen2_5_vl"](tiny._DIMS["3b"], 112)
    params = sum(p.numel() for p in model.parameters())
    assert 2e9 <= params <= 4e9, params
