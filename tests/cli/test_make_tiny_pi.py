"""``joynexus models make-tiny --family pi0|pi05``: tiny LeRobot π checkpoints written by
lerobot 0.6.1's own classes in the reference environment, and a one-line error saying
how to build that environment where it is missing."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.interop.lerobot import read_lerobot_checkpoint
from joynexus.interop.reference import INSTALL, REFERENCE_ENV
from tests.interop.lerobot_pi_helpers import require_reference


@pytest.mark.parametrize("family", ["pi0", "pi05"])
def test_without_the_reference_environment_make_tiny_says_so_in_one_line(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(REFERENCE_ENV, str(tmp_path / "nowhere"))
    out = tmp_path / "x"
    result = CliRunner().invoke(app, ["models", "make-tiny", "--family", family, "--out", str(out)])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "reference environment" in lines[0] and INSTALL in lines[0]
    assert not out.exists()


def test_make_tiny_pi0_writes_a_lerobot_pi0_directory(tmp_path: Path) -> None:
    require_reference()
    out = tmp_path / "pi0"
    result = CliRunner().invoke(app, ["models", "make-tiny", "--family", "pi0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote a LeRobot pi0 policy" in result.output
    ckpt = read_lerobot_checkpoint(out)
    assert ckpt.type == "pi0" and ckpt.max_action_dim == 8 and ckpt.cameras == ["top", "wrist"]
