"""A multi-node Ray cluster on this machine: a head and worker nodes on the loopback.

:class:`LocalCluster` starts Ray's own multi-node harness (``ray.cluster_utils.Cluster``):
every node is a separate raylet with its own resources and its own (capped) object
store, so placement across nodes, object transfer between node stores and the loss of a
node are exercised for real — only the network is the loopback. Every node binds
``127.0.0.1`` and the driver connects there; :func:`loopback_only` makes Ray resolve
its own address to the loopback too (by default it replaces ``127.0.0.1`` with the
machine's outward address when it connects).

A real cluster needs none of this: ``ray start --head`` on one machine, ``ray start
--address HEAD:6379`` on the others, and ``joynexus run|serve --runtime ray --address
HEAD:6379`` (or ``auto`` on a cluster node) places the same actors there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from joynexus.errors import ServiceUnavailableError

__all__ = ["LOOPBACK", "LocalCluster", "NodeSpec", "loopback_only", "transfer_mb_per_s"]

LOOPBACK = "127.0.0.1"
_MIB = 1024 * 1024


class NodeSpec(BaseModel):
    """One node's resources.

    Attributes:
        num_cpus / num_gpus: What the node advertises (GPUs may be fake on a CPU box:
            they only reserve, they compute nothing).
        object_store_mib: The node's object store (shared memory), capped so a test
            cluster does not reserve a share of the machine's RAM per node.
        resources: Custom resources (e.g. ``{"sim": 1}``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_cpus: float = Field(default=1, ge=0)
    num_gpus: float = Field(default=0, ge=0)
    object_store_mib: int = Field(default=80, ge=75)
    resources: dict[str, float] = Field(default_factory=dict)

    def node_args(self) -> dict[str, Any]:
        return {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "object_store_memory": self.object_store_mib * _MIB,
            "resources": dict(self.resources),
            "node_ip_address": LOOPBACK,
        }


def loopback_only() -> None:
    """Keep Ray on ``127.0.0.1``: no outward address is resolved or contacted.

    Ray maps a loopback cluster address to the machine's outward address unless
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is off; the variable is read when ``ray`` is
    imported, so the already imported constant is set as well. A cluster started this
    way accepts only local connections, so token auth is disabled for it.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


class LocalCluster:
    """A head node and worker nodes on the loopback; the driver (this process) connects.

    Args:
        head: The head node (the driver's node: the Training Queue actor lives here).
        workers: One spec per worker node.
        system_config: Ray internals for the whole cluster (e.g. a faster node health
            check: ``{"health_check_period_ms": 500, "health_check_failure_threshold":
            4}`` declares a silent node dead after ~2 s instead of Ray's ~15 s).

    Raises:
        ServiceUnavailableError: Ray is not installed, or a node did not come up.
    """

    def __init__(
        self,
        head: NodeSpec,
        workers: Sequence[NodeSpec] = (),
        *,
        system_config: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            import ray  # noqa: F401
        except ImportError as exc:  # pragma: no cover - ray is an optional extra
            raise ServiceUnavailableError(
                "a multi-node cluster needs the 'ray' extra: pip install 'joynexus[ray]'"
            ) from exc
        loopback_only()
        from ray.cluster_utils import Cluster

        self._cluster: Any = Cluster(
            initialize_head=True,
            connect=True,
            head_node_args={
                **head.node_args(),
                "include_dashboard": False,
                "_system_config": dict(system_config or {}),
            },
        )
        self._workers: dict[str, Any] = {}
        try:
            for spec in workers:
                self.add_worker(spec)
        except BaseException:
            self.shutdown()
            raise

    @property
    def address(self) -> str:
        """The head's GCS address (``127.0.0.1:<port>``)."""
        return str(self._cluster.address)

    @property
    def head_node_id(self) -> str:
        return str(self._cluster.head_node.node_id)

    def worker_ids(self) -> list[str]:
        """Node ids of the live worker nodes, oldest first."""
        return list(self._workers)

    def add_worker(self, spec: NodeSpec, *, timeout_s: float = 60.0) -> str:
        """Start a worker node and wait until the cluster sees it; returns its node id.

        Raises:
            ServiceUnavailableError: the node did not register within ``timeout_s``.
        """
        node = self._cluster.add_node(**spec.node_args())
        node_id = str(node.node_id)
        self._workers[node_id] = node
        try:
            self._cluster.wait_for_nodes(timeout=timeout_s)
        except Exception as exc:
            raise ServiceUnavailableError(
                f"worker node {node_id[:8]} did not join the cluster within {timeout_s:g} s"
            ) from exc
        return node_id

    def kill_worker(self, node_id: str) -> float:
        """Kill a worker node's Ray processes at once (no graceful drain), as a crashed
        machine would; returns the wall time it was killed at."""
        node = self._workers.pop(node_id)
        killed_at = time.time()
        self._cluster.remove_node(node, allow_graceful=False)
        return killed_at

    def shutdown(self) -> None:
        """Disconnect the driver and stop every node (idempotent)."""
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self._cluster.shutdown()
        self._workers = {}

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _node_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def transfer_mb_per_s(src_node: str, dst_node: str, mib: int = 32, repeats: int = 3) -> float:
    """Object-store throughput from one node to another (MB/s, best of ``repeats``).

    A task pinned to ``src_node`` creates ``mib`` MiB in that node's store; a task
    pinned to ``dst_node`` receives it as an argument (Ray pulls it into the
    destination's store) and checks its size. The time is the receiving task's, from
    its start to the data being local, so task start-up is not counted.

    Raises:
        ServiceUnavailableError: the data arrived corrupted.
    """
    import numpy as np
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def pinned(node: str) -> dict[str, Any]:
        return {
            "num_cpus": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False),
        }

    @ray.remote
    def make(n: int) -> Any:
        return np.arange(n, dtype=np.uint8)

    @ray.remote
    def fetch(refs: list[Any]) -> tuple[float, int, str]:
        start = time.perf_counter()
        array = ray.get(refs[0])
        return time.perf_counter() - start, int(array.nbytes), _node_id()

    nbytes = mib * _MIB
    best = 0.0
    for _ in range(repeats):
        ref = make.options(**pinned(src_node)).remote(nbytes)
        ray.wait([ref], fetch_local=False)
        # Passed inside a list, so Ray does not resolve it before the task starts.
        seconds, got, where = ray.get(fetch.options(**pinned(dst_node)).remote([ref]))
        if got != nbytes or where != dst_node:
            raise ServiceUnavailableError(
                f"transfer check failed: {got} of {nbytes} bytes arrived on node {where[:8]}"
            )
        best = max(best, nbytes / 1e6 / max(seconds, 1e-9))
        del ref
    return best
