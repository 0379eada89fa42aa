"""``joynexus spec check`` runs the checks ``joynexus run`` runs, with the same messages."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app

ROOT = Path(__file__).resolve().parents[2]

UNKNOWN_KIND = """\
tenant: warp
task: rl
base_model: {id: "tiny:qwen2_5_vl"}
env: {kind: warp-drive}
algorithm: {name: ppo}
"""


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def test_unknown_env_kind_fails_spec_check_as_it_fails_run(tmp_path: Path) -> None:
    """Regression: `spec check` said ok for an env kind `run` and `submit` refuse."""
    spec = tmp_path / "warp.yaml"
    spec.write_text(UNKNOWN_KIND)
    runner = CliRunner()

    checked = runner.invoke(app, ["spec", "check", str(spec)])
    ran = runner.invoke(app, ["run", str(spec), "--run-dir", str(tmp_path / "run")])

    assert checked.exit_code == 1, checked.output
    assert ran.exit_code == 2, ran.output
    message = "error: unknown env kind 'warp-drive'; known kinds:"
    assert message in _flat(checked.output)
    assert message in _flat(ran.output)
    # Word for word the same line (the known kinds included).
    start = _flat(checked.output).index(message)
    assert _flat(checked.output)[start:] == _flat(ran.output)[_flat(ran.output).index(message) :]
    assert "ok" not in _flat(checked.output).split()
    assert not (tmp_path / "run").exists()  # nothing started


def test_spec_check_accepts_the_shipped_mixed_example() -> None:
    result = CliRunner().invoke(app, ["spec", "check", str(ROOT / "examples/workloads/mixed.yaml")])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output


LEROBOT_ACT = """\
tenant: alice
task: sft
base_model: {id: lerobot/act_aloha_sim_transfer_cube_human}
schema: {cameras: {top: {height: 64, width: 64}}, state_dim: 6, action_dim: 6, action_chunk: 4}
action_module: {type: oft}
dataset: {path: data}
scheduling: {completion_target: 1}
"""


def test_an_unsupported_lerobot_family_fails_spec_check(tmp_path: Path) -> None:
    """Regression: `spec check` said ok for a LeRobot policy the server then failed on."""
    spec = tmp_path / "act.yaml"
    spec.write_text(LEROBOT_ACT)
    checked = CliRunner().invoke(app, ["spec", "check", str(spec)])
    assert checked.exit_code == 1, checked.output
    assert "is a LeRobot 'act' policy; JoyNexus hosts the LeRobot families" in _flat(checked.output)


def test_make_tiny_refuses_a_lerobot_family_it_cannot_build(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["models", "make-tiny", "--family", "act", "--out", str(tmp_path / "x")]
    )
    assert result.exit_code == 2, result.output
    assert "smolvla" in result.output and "pi05" in result.output
    assert not (tmp_path / "x").exists()


def _spec(tmp_path: Path, base_model: str, task: str = "rl") -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"tenant: t\ntask: {task}\nbase_model: {{id: {base_model!r}}}\n"
        "env: {kind: reach2d}\nalgorithm: {name: ppo}\nscheduling: {completion_target: 1}\n"
    )
    return spec


def test_an_unknown_tiny_id_fails_spec_check_naming_every_valid_one(tmp_path: Path) -> None:
    """Regression: `spec check` said ok for `tiny:qwen9`, and the list of tiny ids that
    `run` printed left out `tiny:smolvla`."""
    from joynexus.models.availability import known_ids
    from joynexus.models.tiny import ARCHES

    checked = CliRunner().invoke(app, ["spec", "check", str(_spec(tmp_path, "tiny:qwen9"))])
    assert checked.exit_code == 1, checked.output
    out = _flat(checked.output)
    assert "'tiny:qwen9' is no built-in model" in out
    assert "'tiny:smolvla'" in out
    assert all(f"'tiny:{arch}'" in out for arch in ARCHES)  # the registry, whole
    assert known_ids("tiny:") == [f"tiny:{a}" for a in ARCHES] + ["tiny:smolvla"]


def test_a_hub_id_with_no_local_copy_fails_spec_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: `spec check` said ok for `Qwen/...-doesnotexist`; `run` then spent
    half a minute on hub retries. The answer comes from the local cache alone."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    missing = "Qwen/Qwen2.5-VL-3B-doesnotexist"
    checked = CliRunner().invoke(app, ["spec", "check", str(_spec(tmp_path, missing))])
    assert checked.exit_code == 1, checked.output
    assert f"base_model.id '{missing}' is not available locally" in _flat(checked.output)
    assert f"hf download {missing}" in _flat(checked.output)

    # The same id with a copy in the cache is fine (hub cache layout: refs + snapshot).
    repo = tmp_path / "hub" / "models--Qwen--Qwen2.5-VL-3B-doesnotexist"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    checked = CliRunner().invoke(app, ["spec", "check", str(_spec(tmp_path, missing))])
    assert checked.exit_code == 0, checked.output
    assert "ok t: rl" in _flat(checked.output)


def test_run_offline_refuses_a_hub_id_with_no_local_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = _spec(tmp_path, "Qwen/Qwen2.5-VL-3B-doesnotexist")
    ran = CliRunner().invoke(app, ["run", str(spec), "--run-dir", str(tmp_path / "run")])
    assert ran.exit_code == 2, ran.output
    assert "is not available locally" in _flat(ran.output)
    assert "HF_HUB_OFFLINE is set" in _flat(ran.output)
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_spec_check_of_a_custom_spec_says_it_is_valid_for_a_server(tmp_path: Path) -> None:
    """Regression: `spec check` of a `custom` spec said "`joynexus run` accepts rl, sft
    and eval" though nothing was being run."""
    checked = CliRunner().invoke(
        app, ["spec", "check", str(_spec(tmp_path, "tiny:qwen2_5_vl", task="custom"))]
    )
    assert checked.exit_code == 0, checked.output
    out = _flat(checked.output)
    assert "ok t: custom (valid; custom workloads are submitted to a server" in out
    assert "`joynexus submit`" in out
    assert "accepts rl, sft and eval" not in out
