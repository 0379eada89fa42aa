"""Recording reach2d with its scripted expert (``joynexus data record --env reach2d``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.data import LeRobotDataset
from joynexus.data.record import make_scripted_policy
from joynexus.envs.base import EnvSpec
from joynexus.envs.reach2d import Reach2DScriptedPolicy
from joynexus.errors import SpecError


def test_cli_records_reach2d_episodes_that_reach_the_goal(tmp_path: Path) -> None:
    out = tmp_path / "reach"
    result = CliRunner().invoke(
        app,
        [
            "data",
            "record",
            "--env",
            "reach2d",
            "--episodes",
            "3",
            "--image-size",
            "32",
            "--images",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    ds = LeRobotDataset(out)
    assert ds.num_episodes == 3
    assert ds.features["observation.images.top"].shape == (32, 32, 3)
    # Every episode ends on the success step, and every action points at the goal.
    assert int(np.asarray(ds.column("next.success")).sum()) == 3
    state = np.asarray(ds.column("observation.state"))
    action = np.asarray(ds.column("action"))
    delta = state[:, 2:4] - state[:, 0:2]
    cos = (action * delta).sum(1) / (
        np.linalg.norm(action, axis=1) * np.linalg.norm(delta, axis=1) + 1e-9
    )
    assert cos.min() > 0.99
    assert np.abs(action).max() <= 1.0 + 1e-6


def test_reach2d_expert_uses_the_env_speed() -> None:
    expert = make_scripted_policy(EnvSpec(kind="reach2d", options={"max_speed": 0.3}))
    assert isinstance(expert, Reach2DScriptedPolicy) and expert.max_speed == pytest.approx(0.3)
    with pytest.raises(SpecError, match="unknown option"):
        make_scripted_policy(EnvSpec(kind="reach2d", options={"speed": 0.3}))
