"""``joynexus spec check`` runs the checks ``joynexus run`` runs, with the same messages."""

from __future__ import annotations

from pathlib import Path

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
        app, ["models", "make-tiny", "--family", "pi05", "--out", str(tmp_path / "x")]
    )
    assert result.exit_code == 2, result.output
    assert "smolvla" in result.output
    assert not (tmp_path / "x").exists()
