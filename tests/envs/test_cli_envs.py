"""``joynexus env-server`` argument handling and the ``bench envs`` result shape."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from joynexus.bench.envs import BenchCase, run_envs_bench
from joynexus.cli.main import app
from joynexus.envs import EnvSpec


def test_env_server_rejects_an_unknown_env_before_binding() -> None:
    result = CliRunner().invoke(app, ["env-server", "--env", "NoSuchEnv-v9", "--port", "0"])
    assert result.exit_code == 2
    assert "NoSuchEnv-v9" in result.output


def test_bench_rows_have_the_documented_keys() -> None:
    def zeros(_: np.random.Generator, n: int) -> np.ndarray:
        return np.zeros((n, 2), np.float32)

    cases = [
        BenchCase("fake", EnvSpec(kind="fake", num_envs=n), zeros, has_fast_render=False)
        for n in (1, 3)
    ]
    rows = run_envs_bench(steps=3, cases=cases)["envs"]
    assert [r["vectorized"] for r in rows] == [False, True]
    for row in rows:
        assert {"env", "image_size", "vectorized", "fast_render", "steps_per_s"} <= set(row)
        assert row["steps_per_s"] > 0 and row["fast_render"] is None
