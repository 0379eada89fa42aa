"""`bench lora`: JSON keys and grouped == serial differences (no timing asserts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_cli_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "lora.json"
    args = ["bench", "lora", "--tenants", "2", "--batch", "1", "--ranks", "2,4"]
    args += ["--repeats", "1", "--warmup", "0", "--threads", "1", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "LoRA mixed-adapter forward" in result.output
    doc = json.loads(out.read_text())
    assert set(doc) >= {
        "grouped_vs_serial_max_rel_diff",
        "speedup",
        "train_speedup",
        "peft_speedup",
        "cpu_speedup",
        "train_cpu_speedup",
        "bytes_per_tenant",
    }
    diff = doc["grouped_vs_serial_max_rel_diff"]
    assert diff["forward"] <= 1e-5 and diff["gradients"] <= 1e-5
    assert doc["speedup"] > 0 and doc["train_speedup"] > 0
    assert doc["cpu_speedup"] > 0 and doc["train_cpu_speedup"] > 0
    assert set(doc["bytes_per_tenant"]) == {"2", "4"}
    b2, b4 = doc["bytes_per_tenant"]["2"], doc["bytes_per_tenant"]["4"]
    assert b4["adapter"] == 2 * b2["adapter"]
    assert b2["adapter_with_optimizer"] == 3 * b2["adapter"]
    assert b2["slot_with_optimizer"] > b2["adapter_with_optimizer"]
    assert doc["capacity"]["tenants"]["2"] >= doc["capacity"]["tenants"]["4"] > 0
    for rank in ("2", "4"):
        cell = doc["by_rank"][rank]
        if cell["peft_max_rel_diff"] is not None:  # peft installed: same features as ours
            assert cell["peft_max_rel_diff"] <= 1e-5


def test_cli_rejects_bad_ranks() -> None:
    result = CliRunner().invoke(app, ["bench", "lora", "--ranks", "0"])
    assert result.exit_code != 0


def test_vision_adapters_bench_grouped_equals_serial(tmp_path: Path) -> None:
    out = tmp_path / "lora-vision.json"
    args = ["bench", "lora", "--tenants", "2", "--batch", "1", "--ranks", "2", "--vision"]
    args += ["--repeats", "1", "--warmup", "0", "--threads", "1", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["vision"] is True and doc["peft_speedup"] is None
    diff = doc["grouped_vs_serial_max_rel_diff"]
    assert diff["forward"] <= 1e-5 and diff["gradients"] <= 1e-5
