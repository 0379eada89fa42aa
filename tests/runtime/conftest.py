from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from joynexus.models.tiny import make_tiny

if TYPE_CHECKING:
    from joynexus.runtime.ray_cluster import LocalCluster


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen2.5-VL saved once per session; specs name it by path like a hub id."""
    return str(make_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "qwen"))


@pytest.fixture(scope="session")
def reach2d_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.workflows.helpers import record_reach2d_demos

    return record_reach2d_demos(tmp_path_factory.mktemp("demos") / "reach2d", episodes=20)


class RaySession:
    """The one Ray this test process is attached to: the shared single-node one, or a
    multi-node cluster of one test module. Switching shuts the other down first (a
    driver attaches to one cluster at a time); the session's end shuts down whichever
    is up, so no Ray process outlives the test run."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.cluster: LocalCluster | None = None

    def local(self) -> None:
        if self.kind == "local":
            return
        ray = pytest.importorskip("ray")
        self.close()
        os.environ["RAY_AUTH_MODE"] = "disabled"
        ray.init(
            # "local": always a new instance, never a cluster another process started
            # on this machine (Ray would attach to the last one it recorded).
            address="local",
            num_cpus=2,
            num_gpus=8,
            object_store_memory=200 * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=False,
        )
        self.kind = "local"

    def multinode(self, head: object, workers: list[object]) -> LocalCluster:
        self.close()
        try:
            from joynexus.runtime.ray_cluster import LocalCluster, NodeSpec

            self.cluster = LocalCluster(
                NodeSpec.model_validate(head),
                [NodeSpec.model_validate(w) for w in workers],
                # A lost node is declared dead after ~2 s (Ray's default: ~15 s).
                system_config={"health_check_period_ms": 500, "health_check_failure_threshold": 4},
            )
        except Exception as exc:
            # Never a skip: a multinode test that cannot get its cluster fails, with why.
            pytest.fail(f"the multi-node Ray cluster could not start: {exc!r}")
        self.kind = "multinode"
        return self.cluster

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
        elif self.kind == "local":
            import ray

            ray.shutdown()
        self.kind = None


@pytest.fixture(scope="session")
def ray_session() -> Iterator[RaySession]:
    session = RaySession()
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def ray_cluster(ray_session: RaySession) -> None:
    """ONE local Ray cluster for every Ray test of the session (ray.init costs ~10 s).

    8 fake GPUs let placement groups of the paper's layouts be reserved on a CPU machine;
    the object store is capped so it does not reserve 30 % of RAM in /dev/shm.
    """
    ray_session.local()


#: The multi-node test cluster: the head (driver, Training Queue, simulators) and two
#: workers, one advertising ``trainer`` and one ``rollout``; a role's bundle asks for
#: its resource (``MULTINODE_ROLES``), so each role lands on its own node.
MULTINODE_HEAD = {"num_cpus": 1, "resources": {"sim": 1}}
MULTINODE_TRAINER = {"num_cpus": 1, "resources": {"trainer": 1}}
MULTINODE_ROLLOUT = {"num_cpus": 1, "resources": {"rollout": 1}}
MULTINODE_ROLES = {"actor": "trainer", "inference": "rollout", "environment": "sim"}


@pytest.fixture(scope="module")
def multinode_cluster(ray_session: RaySession) -> Iterator[LocalCluster]:
    """A head and two worker nodes on 127.0.0.1, shared by the tests of one module."""
    cluster = ray_session.multinode(MULTINODE_HEAD, [MULTINODE_TRAINER, MULTINODE_ROLLOUT])
    try:
        yield cluster
    finally:
        ray_session.close()
