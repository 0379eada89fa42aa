"""``joynexus bench group-batching --arch pi05``: the option's checks.

The measured runs (a π0.5 built by lerobot 0.6.1, tiny and at its smallest real variant)
are ``docs/results/group-batching-pi05-*.json``; building the checkpoint takes most of a
minute here (minutes at real size), so these tests check what the option refuses before
anything is built.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app


def _plain(text: str) -> str:
    # Typer's error box wraps and frames the message: keep the words only.
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_pi05_is_built_at_tiny_or_real_size_only() -> None:
    result = CliRunner().invoke(
        app, ["bench", "group-batching", "--arch", "pi05", "--size", "small"]
    )
    assert result.exit_code == 2
    assert "pi05 is built at --size tiny or real" in _plain(result.output)


def test_pi05_without_the_reference_environment_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOYNEXUS_LEROBOT_REFERENCE", str(tmp_path / "none"))
    result = CliRunner().invoke(
        app, ["bench", "group-batching", "--arch", "pi05", "--tenants", "2", "--batch", "1"]
    )
    assert result.exit_code == 2
    words = _plain(result.output)
    assert "pi05 builds its checkpoint with lerobot" in words
    assert "build it with" in words
    # At real size too: the real π0.5 is lerobot's as well, never a stand-in.
    result = CliRunner().invoke(
        app, ["bench", "group-batching", "--arch", "pi05", "--size", "real"]
    )
    assert result.exit_code == 2
    assert "pi05 builds its checkpoint with lerobot" in _plain(result.output)
