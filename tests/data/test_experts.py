"""Scripted experts succeed, and a recording keeps their successful episodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.data.reader import LeRobotDataset
from joynexus.data.record import make_scripted_policy, record_episodes
from joynexus.envs import EnvSpec, make_env
from joynexus.errors import DatasetError, SpecError


@pytest.mark.filterwarnings("ignore:Constant:UserWarning")  # metaworld's own expert warns
@pytest.mark.parametrize("task", ["reach-v3", "push-v3", "pick-place-v3"])
def test_metaworld_experts_succeed(task: str) -> None:
    pytest.importorskip("metaworld")
    # Without rendering: the expert reads the 39-D state, and a step costs milliseconds.
    spec = EnvSpec(kind="metaworld", task=task, image_size=8, observation={"images": False})
    env, expert = make_env(spec), make_scripted_policy(spec)
    try:
        for seed in (11, 12):
            obs, succeeded = env.reset(seed=seed), False
            for _ in range(300):
                step = env.step(expert.act(env, obs))
                obs, succeeded = step.observation, bool(step.success[0])
                if step.terminated[0] or step.truncated[0]:
                    break
            assert succeeded, f"{task} expert failed on seed {seed}"
    finally:
        env.close()


def test_only_successful_episodes_are_kept_unless_asked(tmp_path: Path) -> None:
    # 4 steps reach the goal only from the closest starts: some episodes fail.
    spec = EnvSpec(kind="reach2d", image_size=8)
    seen: list[bool] = []
    kept = record_episodes(
        spec,
        tmp_path / "ok",
        episodes=8,
        max_steps=4,
        use_videos=False,
        keep_failures=False,
        on_episode=lambda _ep, _n, ok: seen.append(ok),
    )
    assert 0 < kept.successes < 8 and kept.episodes == 8
    assert kept.kept == kept.successes == sum(seen)
    ds = LeRobotDataset(tmp_path / "ok")
    assert ds.num_episodes == kept.kept and len(ds) == kept.frames
    episodes = np.asarray(ds.column("episode_index"))
    success = np.asarray(ds.column("next.success")).reshape(-1)
    assert {int(e) for e in episodes[success]} == set(range(kept.kept))  # each one succeeds
    every = record_episodes(
        spec, tmp_path / "all", episodes=8, max_steps=4, use_videos=False, keep_failures=True
    )
    assert every.kept == 8 and every.successes == kept.successes


def test_a_recording_of_only_failures_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="none of the 2 episodes"):
        record_episodes(
            EnvSpec(kind="reach2d", image_size=8),
            tmp_path / "none",
            episodes=2,
            max_steps=1,
            seed=3,
            use_videos=False,
            keep_failures=False,
        )
    assert not (tmp_path / "none").exists()


def test_cli_prints_the_expert_success_rate_and_keeps_successes(tmp_path: Path) -> None:
    args = ["data", "record", "--env", "reach2d", "--episodes", "8", "--max-steps", "4"]
    args += ["--image-size", "8", "--images", "--out"]
    result = CliRunner().invoke(app, [*args, str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    ds = LeRobotDataset(tmp_path / "a")
    assert f"wrote {tmp_path / 'a'}: {ds.num_episodes} episodes" in text
    assert f"expert success rate {ds.num_episodes / 8:.0%} ({ds.num_episodes}/8" in text
    result = CliRunner().invoke(app, [*args, str(tmp_path / "b"), "--keep-failures"])
    assert result.exit_code == 0, result.output
    assert LeRobotDataset(tmp_path / "b").num_episodes == 8


def _maniskill_expert_run(task: str, seeds: tuple[int, ...], steps: int = 60) -> list[bool]:
    """Whether the expert reached ManiSkill's ``success`` within ``steps``, per seed."""
    spec = EnvSpec(
        kind="maniskill",
        task=task,
        image_size=8,
        max_episode_steps=steps,
        options={"control_mode": "pd_ee_delta_pos"},
        observation={"images": False, "state": "privileged"},
    )
    env, expert = make_env(spec), make_scripted_policy(spec)
    results = []
    try:
        for seed in seeds:
            expert.reset()
            obs, succeeded = env.reset(seed=seed), False
            for _ in range(steps):
                step = env.step(expert.act(env, obs))
                obs, succeeded = step.observation, bool(step.success[0])
                if step.terminated[0] or step.truncated[0]:
                    break
            results.append(succeeded)
    finally:
        env.close()
    return results


@pytest.mark.parametrize("task", ["PushCube-v1", "PickCube-v1"])
def test_maniskill_experts_succeed(task: str) -> None:
    pytest.importorskip("mani_skill")
    assert _maniskill_expert_run(task, (21, 22)) == [True, True], f"{task} expert failed"


def test_maniskill_stack_cube_expert_stacks_and_lets_go() -> None:
    pytest.importorskip("mani_skill")
    # ManiSkill's success: cube A rests on cube B, static, and the gripper released it.
    results = _maniskill_expert_run("StackCube-v1", (3, 4, 5))
    assert sum(results) >= 2, f"StackCube expert succeeded on {results} of seeds 3, 4, 5"


def test_maniskill_expert_needs_end_effector_control() -> None:
    with pytest.raises(SpecError, match="pd_ee_delta_pos"):
        make_scripted_policy(EnvSpec(kind="maniskill", task="PushCube-v1"))
    with pytest.raises(SpecError, match="no scripted ManiSkill expert"):
        make_scripted_policy(
            EnvSpec(
                kind="maniskill",
                task="PullCube-v1",
                options={"control_mode": "pd_ee_delta_pos"},
            )
        )
    with pytest.raises(SpecError, match="needs a task"):
        make_scripted_policy(EnvSpec(kind="maniskill"))


def test_cli_records_maniskill_in_the_experts_control_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import joynexus.data.record as record_mod

    seen: list[EnvSpec] = []

    def fake_record(spec: EnvSpec, out: Path, **_: object) -> record_mod.RecordSummary:
        seen.append(spec)
        return record_mod.RecordSummary(root=Path(out), episodes=1, frames=3, successes=1)

    monkeypatch.setattr(record_mod, "record_episodes", fake_record)
    args = ["data", "record", "--env", "maniskill", "--task", "StackCube-v1", "--out"]
    result = CliRunner().invoke(app, [*args, str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert seen[0].task == "StackCube-v1"
    assert seen[0].options == {"control_mode": "pd_ee_delta_pos"}


def test_cli_refuses_a_maniskill_task_without_an_expert(tmp_path: Path) -> None:
    args = ["data", "record", "--env", "maniskill", "--task", "PullCube-v1", "--out"]
    result = CliRunner().invoke(app, [*args, str(tmp_path / "a")])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "no scripted ManiSkill expert for 'PullCube-v1'" in text
    assert "PickCube-v1, PushCube-v1, StackCube-v1" in text
    assert not (tmp_path / "a").exists()
