"""``joynexus bench pi-parity``'s cheap parts (the real-size run itself is a
documented command, docs/results/notes/resident-models.md: 7.8 GB per copy is too big for
CI) and ``models make-tiny``'s size check for LeRobot families."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from joynexus.bench.pi_parity import available_gib, parameters
from joynexus.cli.main import app


def test_parameters_are_counted_from_the_header(tmp_path: Path) -> None:
    save_file(
        {"a": torch.zeros(3, 4), "b": torch.zeros(5), "c": torch.zeros(2, 2, 2)},
        str(tmp_path / "model.safetensors"),
    )
    assert parameters(tmp_path) == 12 + 5 + 8


def test_available_memory_is_positive() -> None:
    assert available_gib() > 0


def test_a_real_size_is_refused_for_a_family_built_tiny_only(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["models", "make-tiny", "--family", "smolvla", "--size", "real", "--out", str(tmp_path)],
    )
    assert result.exit_code != 0
    assert "--size tiny" in result.output
    assert not any(tmp_path.iterdir())


def test_bench_pi_parity_refuses_an_unknown_family_or_size() -> None:
    for args in (["--family", "act"], ["--size", "huge"]):
        result = CliRunner().invoke(app, ["bench", "pi-parity", *args])
        assert result.exit_code == 2, result.output
        assert "--family pi05|pi0 and --size tiny|real" in " ".join(result.output.split())
