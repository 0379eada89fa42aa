from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from joynexus.models.tiny import make_tiny


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen2.5-VL saved once per session; specs name it by path like a hub id."""
    return str(make_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "qwen"))


@pytest.fixture(scope="session")
def reach2d_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.workflows.helpers import record_reach2d_demos

    return record_reach2d_demos(tmp_path_factory.mktemp("demos") / "reach2d", episodes=20)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """ONE local Ray cluster for every Ray test of the session (ray.init costs ~10 s).

    8 fake GPUs let placement groups of the paper's layouts be reserved on a CPU machine;
    the object store is capped so it does not reserve 30 % of RAM in /dev/shm.
    """
    ray = pytest.importorskip("ray")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(
        num_cpus=2,
        num_gpus=8,
        object_store_memory=200 * 1024 * 1024,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
