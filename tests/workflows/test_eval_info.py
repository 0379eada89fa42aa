"""Evaluation in LeRobot's layout (eval_info.json) on seeds the spec names."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest

from joynexus.errors import SpecError
from joynexus.services.environment import EnvironmentService
from joynexus.services.rollout import run_evaluation
from joynexus.spec.workload import parse_spec
from joynexus.workflows.eval_info import eval_info, write_eval_info
from joynexus.workflows.evaluation import _segments
from tests.fakes.plane import FakeServer, eval_spec, rl_spec
from tests.services.test_seeded_evaluation import SeededEnv, _predict

A = "alice"


def _seeded(seeds: Any, **evaluation: Any) -> Any:
    spec = eval_spec(A, [A]).model_dump(by_alias=True, mode="json")
    spec["evaluation"].pop("episodes")
    spec["evaluation"].update(seeds=seeds, **evaluation)
    return parse_spec(spec)


def test_spec_names_seeds_as_a_list_or_a_range() -> None:
    assert _seeded([5, 6, 9]).evaluation.seed_list() == [5, 6, 9]
    ranged = _seeded({"start": 100, "count": 3}).evaluation
    assert ranged.seed_list() == [100, 101, 102] and ranged.episodes_per_run == 3
    with pytest.raises(SpecError, match="one episode per seed"):
        _seeded([1, 2], episodes=5)
    assert _segments([5, 6, 9, 10, 11, 3]) == [(5, 2), (9, 3), (3, 1)]


def test_episodes_record_sum_and_max_reward_and_repeat_on_the_same_seeds() -> None:
    def once() -> Any:
        return asyncio.run(
            run_evaluation(
                _predict,
                cast(EnvironmentService, SeededEnv(2)),
                tenant_id="t",
                session_id="s",
                session_tenant="t",
                episodes=3,
                version=1,
                deterministic=True,
                seed=3,
            )
        )

    first, second = once(), once()
    # SeededEnv: one reward (the seed) at the episode's last step, success on seed % 3 == 0
    assert first.episode_returns == first.episode_max_rewards == (3.0, 4.0, 5.0)
    assert first.episode_successes == (True, False, False)
    assert (second.episode_returns, second.episode_successes) == (
        first.episode_returns,
        first.episode_successes,
    )


def test_eval_info_has_lerobots_layout(tmp_path: Path) -> None:
    info = eval_info(
        group="metaworld",
        task="reach-v3",
        sum_rewards=[1.0, 3.0],
        max_rewards=[0.5, 2.0],
        successes=[True, False],
        seeds=[7, 8],
        eval_s=4.0,
        extra={"target": "t"},
    )
    write_eval_info(tmp_path / "eval_info.json", info)
    back = json.loads((tmp_path / "eval_info.json").read_text())
    assert back["overall"] == {
        "avg_sum_reward": 2.0,
        "avg_max_reward": 1.25,
        "pc_success": 50.0,
        "n_episodes": 2,
        "eval_s": 4.0,
        "eval_ep_s": 2.0,
        "video_paths": [],
    }
    assert back["per_group"]["metaworld"]["pc_success"] == 50.0
    task = back["per_task"][0]
    assert task["task_group"] == "metaworld" and task["metrics"]["successes"] == [True, False]
    assert [e["seed"] for e in back["per_episode"]] == [7, 8]
    assert back["joynexus"] == {"target": "t", "seeds": [7, 8]}


def test_two_evaluations_on_the_same_seeds_write_the_same_episodes(tmp_path: Path) -> None:
    srv = FakeServer(tmp_path / "run")
    try:
        wid = srv.run(srv.master.lifecycle.submit(rl_spec(A, target=2), A)).workload_id
        srv.run(srv.master.lifecycle.wait(wid, timeout_s=10))
        infos = []
        for _ in range(2):
            st = srv.run(srv.master.lifecycle.submit(_seeded({"start": 40, "count": 2}), A))
            done = srv.run(srv.master.lifecycle.wait(st.workload_id, timeout_s=20))
            assert done.state.value == "completed", done
            [path] = (tmp_path / "run").rglob("eval_info.json")
            infos.append(json.loads(path.read_text()))
            path.unlink()
        assert infos[0]["per_episode"] == infos[1]["per_episode"]
        assert [e["seed"] for e in infos[0]["per_episode"]] == [40, 41]
        assert infos[0]["overall"]["n_episodes"] == 2
        assert infos[0]["joynexus"]["target"] == A
    finally:
        srv.close()
