"""``joynexus serve --max-wait-ms / --max-batch-size``: the Inference Queue's T and B."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.errors import ServiceUnavailableError
from joynexus.runtime.hosting import RuntimeConfig
from joynexus.server.config import DEFAULT_SERVE_MAX_WAIT_MS, RUNTIME_PREDICT_DEADLINE_S


def _planned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str) -> RuntimeConfig:
    """The runtime knobs ``serve`` builds its plane with (the plane itself is not built:
    the stand-in stops ``serve`` there, as a failed build would)."""
    seen: dict[str, Any] = {}
    # A run directory per call: ``serve`` holds its lock until the process exits.
    run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"

    def build_plane(*_a: Any, config: RuntimeConfig, **_kw: Any) -> None:
        seen["config"] = config
        raise ServiceUnavailableError("stopped here by the test")

    monkeypatch.setattr("joynexus.server.serve.build_plane", build_plane)
    result = CliRunner().invoke(app, ["serve", "--port", "0", "--run-dir", str(run_dir), *args])
    assert result.exit_code == 1, result.output
    assert "stopped here by the test" in result.output
    config = seen["config"]
    assert isinstance(config, RuntimeConfig)
    return config


def test_t_and_b_reach_the_inference_queues_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = _planned(monkeypatch, tmp_path, "--max-wait-ms", "2.5", "--max-batch-size", "16")
    assert config.max_wait_s == pytest.approx(0.0025)
    assert config.max_batch_size == 16


def test_serves_default_t_is_its_own_and_b_the_runtimes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = _planned(monkeypatch, tmp_path)
    assert config.max_wait_s == pytest.approx(DEFAULT_SERVE_MAX_WAIT_MS / 1e3)
    assert config.max_batch_size == RuntimeConfig().max_batch_size
    # Zero is a valid T: a batch fires as soon as the model is free.
    assert _planned(monkeypatch, tmp_path, "--max-wait-ms", "0").max_wait_s == 0.0


def test_serves_deadline_bound_is_the_runtimes() -> None:
    assert RuntimeConfig().predict_deadline_s == RUNTIME_PREDICT_DEADLINE_S


def test_the_predict_deadline_reaches_the_runtime_and_bounds_t(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert _planned(monkeypatch, tmp_path).predict_deadline_s == RUNTIME_PREDICT_DEADLINE_S
    # A real-size model on a CPU: one grouped forward can take minutes.
    config = _planned(
        monkeypatch, tmp_path, "--predict-deadline-s", "600", "--max-wait-ms", "61000"
    )
    assert config.predict_deadline_s == 600.0
    assert config.max_wait_s == pytest.approx(61.0)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-wait-ms", "-1"),
        ("--max-wait-ms", "nan"),
        ("--max-wait-ms", "inf"),
        ("--max-wait-ms", "60001"),  # past the predict deadline: every lone predict 504s
        ("--max-batch-size", "0"),
        ("--predict-deadline-s", "0"),
        ("--predict-deadline-s", "inf"),
        ("--predict-deadline-s", "nan"),
    ],
)
def test_a_bad_t_or_b_exits_2_naming_the_option(tmp_path: Path, option: str, value: str) -> None:
    result = CliRunner().invoke(
        app, ["serve", "--port", "0", "--run-dir", str(tmp_path / "run"), option, value]
    )
    assert result.exit_code == 2
    assert option in result.output
    assert not (tmp_path / "run").exists()  # refused before anything was created
