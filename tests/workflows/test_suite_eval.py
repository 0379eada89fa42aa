"""An evaluation over every task of a LIBERO suite: per-task and overall success.

Runs on the fake plane (numpy sub-envs behind the Environment Service's contract, even
sub-envs succeed), so it checks the workflow — one session per task, opened and closed
in turn, per-task and pooled Wilson intervals in the record and the run summary — not
LIBERO's physics (tests/envs/test_libero.py does that).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from joynexus.algorithms.intervals import wilson_interval
from joynexus.api import WorkloadState
from joynexus.envs.base import EnvSpec
from joynexus.errors import SpecError
from joynexus.spec.workload import WorkloadSpec, parse_spec
from joynexus.workflows.compile import compile_workloads
from joynexus.workflows.evaluation import evaluation_tasks
from tests.fakes.plane import FAKE_BASE_ID, FakeServer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libero") is None, reason="hf-libero is not installed"
)

A = E = "alice"  # a tenant evaluates its own policy
ENV = {"kind": "libero", "task": "libero_spatial/0", "image_size": 8, "max_episode_steps": 3}


def _rl() -> WorkloadSpec:
    return parse_spec(
        {
            "tenant": A,
            "task": "rl",
            "base_model": {"id": FAKE_BASE_ID},
            "env": {**ENV, "num_envs": 2},
            "algorithm": {"name": "ppo", "horizon": 2, "microbatch_size": 4},
            "action_module": {"type": "oft", "hidden_dim": 8, "num_blocks": 1},
            "scheduling": {"completion_target": 1, "max_in_flight": 1},
        }
    )


def _suite_eval(tasks: list[str], tenant: str = E, **env: Any) -> WorkloadSpec:
    return parse_spec(
        {
            "tenant": tenant,
            "task": "eval",
            "base_model": {"id": FAKE_BASE_ID},
            "env": {**ENV, "num_envs": 2, **env},
            "evaluation": {"targets": [A], "episodes": 2, "interval_s": 0.01, "tasks": tasks},
        }
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeServer]:
    srv = FakeServer(tmp_path / "run")
    yield srv
    srv.close()


def test_a_suite_pattern_expands_to_every_task() -> None:
    env = EnvSpec(kind="libero", task="libero_goal/0")
    assert evaluation_tasks(env, ["libero_goal/*"]) == [f"libero_goal/{i}" for i in range(10)]
    assert len(evaluation_tasks(env, ["libero_90/*", "libero_10/3"])) == 91
    with pytest.raises(SpecError, match="names a LIBERO suite"):
        evaluation_tasks(EnvSpec(kind="reach2d"), ["reach2d/*"])
    with pytest.raises(SpecError, match="unknown LIBERO suite"):
        evaluation_tasks(env, ["libero_100/*"])


def test_a_bad_task_fails_validation_naming_it() -> None:
    with pytest.raises(SpecError, match=r"evaluation task 'libero_spatial/12': .* has 10 tasks"):
        compile_workloads([_rl(), _suite_eval(["libero_spatial/1", "libero_spatial/12"], "bob")])


def test_the_suite_evaluation_reports_each_task_and_the_whole_suite(server: FakeServer) -> None:
    trained = server.run(server.master.lifecycle.submit(_rl(), A))
    assert server.run(server.master.lifecycle.wait(trained.workload_id, timeout_s=10)).state is (
        WorkloadState.COMPLETED
    )
    closed = len(server.plane.env.closed)
    st = server.run(server.master.lifecycle.submit(_suite_eval(["libero_spatial/*"]), E))
    done = server.run(server.master.lifecycle.wait(st.workload_id, timeout_s=20))
    assert done.state is WorkloadState.COMPLETED, done
    (record,) = server.master.reporter.metrics(E, st.workload_id, kind="eval").records
    rows = record["per_task"]
    assert [r["task"] for r in rows] == [f"libero_spatial/{i}" for i in range(10)]
    for row in rows:
        # Two episodes per task; the fake's even sub-env succeeds, the odd one does not.
        assert (row["episodes"], row["successes"]) == (2, 1)
        assert row["success_ci95"] == pytest.approx(list(wilson_interval(1, 2)))
    assert (record["episodes"], record["success_rate"]) == (20, 0.5)
    assert record["success_ci95"] == pytest.approx(list(wilson_interval(10, 20)))
    # One session per task, each closed when its task is done (and the evaluation's own).
    assert len(server.plane.env.closed) - closed == 11
    assert server.plane.env.open_sessions(E) == []
    # LeRobot's layout: one per_task entry per task, pooled overall.
    (path,) = list(server.run_dir.rglob("eval_info.json"))
    info = json.loads(path.read_text())
    assert [t["task"] for t in info["per_task"]] == [f"libero_spatial/{i}" for i in range(10)]
    assert info["overall"]["n_episodes"] == 20 and info["overall"]["pc_success"] == 50.0


def test_two_tasks_two_seeded_episodes_write_lerobots_eval_info(server: FakeServer) -> None:
    """The CI-sized suite evaluation: every field a lerobot-eval reader takes, per task."""
    trained = server.run(server.master.lifecycle.submit(_rl(), A))
    server.run(server.master.lifecycle.wait(trained.workload_id, timeout_s=10))
    spec = _suite_eval(["libero_goal/0", "libero_goal/1"]).model_dump(by_alias=True, mode="json")
    spec["evaluation"].pop("episodes")
    spec["evaluation"]["seeds"] = {"start": 1_000_000, "count": 2}
    st = server.run(server.master.lifecycle.submit(parse_spec(spec), E))
    assert server.run(server.master.lifecycle.wait(st.workload_id, timeout_s=20)).state is (
        WorkloadState.COMPLETED
    )
    (path,) = list(server.run_dir.rglob("eval_info.json"))
    assert path.parts[-3:] == ("run_0", A, "eval_info.json")
    info = json.loads(path.read_text())
    assert set(info) == {"per_episode", "per_task", "per_group", "overall", "joynexus"}
    # Episodes in task order, each task on the same seeds.
    assert [e["seed"] for e in info["per_episode"]] == [1_000_000, 1_000_001] * 2
    assert [e["episode_ix"] for e in info["per_episode"]] == [0, 1, 2, 3]
    tasks = info["per_task"]
    assert [(t["task_group"], t["task_id"], t["task"]) for t in tasks] == [
        ("libero", 0, "libero_goal/0"),
        ("libero", 1, "libero_goal/1"),
    ]
    for task, first in zip(tasks, (0, 2), strict=True):
        metrics = task["metrics"]
        assert set(metrics) == {"sum_rewards", "max_rewards", "successes", "video_paths"}
        episodes = info["per_episode"][first : first + 2]
        assert metrics["successes"] == [e["success"] for e in episodes]
        assert metrics["sum_rewards"] == [e["sum_reward"] for e in episodes]
    successes = [e["success"] for e in info["per_episode"]]
    overall = info["overall"]
    assert overall["n_episodes"] == 4
    assert overall["pc_success"] == pytest.approx(100 * sum(successes) / 4)
    assert overall["eval_ep_s"] == pytest.approx(overall["eval_s"] / 4)
    assert info["per_group"]["libero"]["pc_success"] == overall["pc_success"]
    assert info["joynexus"]["seeds"] == [1_000_000, 1_000_001]
    assert info["joynexus"]["target"] == A


def test_tasks_evaluate_in_parallel_sessions_and_keep_their_order(server: FakeServer) -> None:
    trained = server.run(server.master.lifecycle.submit(_rl(), A))
    server.run(server.master.lifecycle.wait(trained.workload_id, timeout_s=10))
    env = server.plane.env
    create, peak = env.create_session, [0]

    async def counting(tenant_id: str, spec: EnvSpec) -> Any:
        info = await create(tenant_id, spec)
        peak[0] = max(peak[0], len(env.open_sessions(E)))
        return info

    env.create_session = counting  # type: ignore[method-assign]
    spec = _suite_eval(["libero_spatial/*"]).model_dump(by_alias=True, mode="json")
    spec["evaluation"]["sessions"] = 3
    st = server.run(server.master.lifecycle.submit(parse_spec(spec), E))
    done = server.run(server.master.lifecycle.wait(st.workload_id, timeout_s=20))
    assert done.state is WorkloadState.COMPLETED, done
    # The evaluation's own session and three tasks' at once, never more.
    assert peak[0] == 4
    assert env.open_sessions(E) == []
    (record,) = server.master.reporter.metrics(E, st.workload_id, kind="eval").records
    assert [r["task"] for r in record["per_task"]] == [f"libero_spatial/{i}" for i in range(10)]
    assert all((r["episodes"], r["successes"]) == (2, 1) for r in record["per_task"])
    # Each task, as it finished, was a metrics line (and progress to the watchdog).
    done_tasks = server.master.reporter.metrics(E, st.workload_id, kind="eval_task").records
    assert sorted(r["task"] for r in done_tasks) == sorted(r["task"] for r in record["per_task"])
    assert all((r["episodes"], r["successes"]) == (2, 1) for r in done_tasks)
