"""make_tiny / `joynexus models make-tiny`: real classes, offline, deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.models.tiny import SIDECAR, make_tiny
from tests.models.conftest import TinyModelDir

EXPECTED_CLASS = {
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor"),
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", "Qwen3VLProcessor"),
    "paligemma": ("PaliGemmaForConditionalGeneration", "PaliGemmaProcessor"),
    "smolvlm": ("SmolVLMForConditionalGeneration", "SmolVLMProcessor"),
    "pi0": ("PI0ForConditionalGeneration", "PI0Processor"),
}


@pytest.mark.parametrize("arch", sorted(EXPECTED_CLASS))
def test_tiny_model_uses_real_classes(arch: str, tiny_model_dir: TinyModelDir) -> None:
    from transformers import AutoProcessor, AutoTokenizer

    path = tiny_model_dir(arch)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == [EXPECTED_CLASS[arch][0]]
    processor = AutoProcessor.from_pretrained(path, local_files_only=True)
    assert type(processor).__name__ == EXPECTED_CLASS[arch][1]
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    ids = tokenizer("pick up the red block")["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "pick up the red block"
    info = json.loads((path / SIDECAR).read_text())
    assert 300_000 <= info["num_parameters"] <= 2_000_000


def test_same_seed_same_weights_other_seed_other_weights(tmp_path: Path) -> None:
    a = load_file(make_tiny("qwen2_5_vl", tmp_path / "a", seed=3) / "model.safetensors")
    b = load_file(make_tiny("qwen2_5_vl", tmp_path / "b", seed=3) / "model.safetensors")
    c = load_file(make_tiny("qwen2_5_vl", tmp_path / "c", seed=4) / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (
        tmp_path / "b" / "tokenizer.json"
    ).read_text()


def test_building_does_not_disturb_the_callers_rng(tmp_path: Path) -> None:
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    make_tiny("qwen3_vl", tmp_path, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_cli_make_tiny_small(tmp_path: Path) -> None:
    out = tmp_path / "small"
    result = CliRunner().invoke(
        app, ["models", "make-tiny", "--arch", "qwen3_vl", "--size", "small", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "qwen3_vl" in result.output
    info = json.loads((out / SIDECAR).read_text())
    assert info["size"] == "small" and info["num_parameters"] >= 10_000_000
    assert (out / "model.safetensors").is_file() and (out / "processor_config.json").exists()


def test_cli_rejects_unknown_arch(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["models", "make-tiny", "--arch", "llama", "--out", str(tmp_path)]
    )
    assert result.exit_code != 0
    assert "qwen2_5_vl" in result.output
