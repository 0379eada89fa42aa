"""``joynexus eval``: a served policy on named seeds, written in lerobot-eval's layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from joynexus.cli.evaluate import evaluate_served, parse_seeds
from joynexus.client import Client
from tests.server.livesrv import make_live, reach_custom, tiny_model, uvicorn_thread

__all__ = ["tiny_model"]  # the session fixture, used by name

ENV = {"kind": "reach2d", "image_size": 32, "max_episode_steps": 4}


def test_parse_seeds() -> None:
    assert parse_seeds("3:6") == [3, 4, 5] and parse_seeds("7,1") == [7, 1]
    with pytest.raises(typer.BadParameter, match="START:STOP"):
        parse_seeds("a:b")


def test_same_seeds_same_episodes_with_videos(tmp_path: Path, tiny_model: str) -> None:
    srv = make_live(tmp_path / "run", tiny_model)
    admin = srv.tenants.create_admin_key().api_key
    with uvicorn_thread(srv.app) as base:
        with Client(base, admin) as c:
            key = str(c.create_tenant("alice")["api_key"])
        with Client(base, key, timeout=60) as c:
            st = c.submit(reach_custom("alice", tiny_model))
            assert c.wait(st.workload_id, states=["running"], timeout_s=120).state.value == (
                "running"
            )
            first = evaluate_served(c, "alice", ENV, [5, 6], tmp_path / "a", videos=True)
            second = evaluate_served(c, "alice", ENV, [5, 6], tmp_path / "b")
    assert first["per_episode"] == second["per_episode"]
    assert [e["seed"] for e in first["per_episode"]] == [5, 6]
    overall = json.loads((tmp_path / "a" / "eval_info.json").read_text())["overall"]
    assert overall["n_episodes"] == 2 and overall["eval_ep_s"] > 0
    assert set(overall) >= {"pc_success", "avg_sum_reward", "avg_max_reward", "eval_s"}
    videos = sorted((tmp_path / "a" / "videos" / "reach2d").glob("eval_episode_*.mp4"))
    assert [v.name for v in videos] == ["eval_episode_0.mp4", "eval_episode_1.mp4"]
    assert overall["video_paths"] == [
        "videos/reach2d/eval_episode_0.mp4",
        "videos/reach2d/eval_episode_1.mp4",
    ]
