"""The Ray placement on a real multi-node cluster (a head and two workers on 127.0.0.1).

Every node is its own raylet with its own resources and object store
(``multinode_cluster`` in conftest). The layout's roles are pinned by custom node
resources: training on the ``trainer`` worker, the rollout engines on the ``rollout``
worker, the simulators on the head (with the driver and the Training Queue).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joynexus.master.run import LocalRun
from joynexus.models.backbone import ResidentBaseModel
from joynexus.runtime.ray_cluster import LocalCluster, transfer_mb_per_s
from joynexus.runtime.ray_hosting import RayHosting, RayPlacement
from joynexus.workflows.summary import RunSummary, TenantProgress
from tests.runtime.conftest import MULTINODE_ROLES
from tests.runtime.ray_helpers import run_checked
from tests.workflows.helpers import rl_spec

pytestmark = [pytest.mark.ray, pytest.mark.multinode]


def test_objects_move_between_node_stores(multinode_cluster: LocalCluster) -> None:
    trainer_node = multinode_cluster.worker_ids()[0]
    # Training Queue columns live in the head's store; the trainer pulls them into its own.
    assert transfer_mb_per_s(multinode_cluster.head_node_id, trainer_node, mib=8, repeats=1) > 0


def test_a_strict_spread_that_does_not_fit_is_refused_with_the_reason(
    multinode_cluster: LocalCluster,
) -> None:
    from joynexus.errors import CapacityError
    from joynexus.runtime.placement import Layout, build_placement

    # Three roles, one per node: fits the three nodes; a fourth role-sized bundle would
    # not, so pin two roles to the one rollout node instead.
    with pytest.raises(CapacityError, match=r"STRICT_SPREAD.*3 live node"):
        build_placement(
            Layout.parse("cpu"),
            timeout_s=2,
            strategy="STRICT_SPREAD",
            role_resources={"actor": "rollout", "inference": "rollout"},
        )


# A whole workload on a shared 2-core machine: more than the default 300 s can pass.
@pytest.mark.timeout(900)
def test_a_two_rank_training_role_trains_what_one_process_trains(
    multinode_cluster: LocalCluster, tmp_path: Path, tiny_model: str
) -> None:
    from joynexus.control.job import TaskType
    from joynexus.queues.training import TrainingQueue
    from joynexus.runtime.plane import build_plane
    from joynexus.runtime.ranks import DataParallelRole
    from joynexus.services.training import TrainingModelService
    from joynexus.spec.workload import BaseModelSpec
    from tests.services.test_training_service import config, make_job, put_rl, put_sft

    async def train(svc: Any, queue: Any, out: Path) -> dict[str, list[float]]:
        sig = (await svc.add_tenant(config("s", out))).schema_signature
        await svc.add_tenant(config("r", out, algo="grpo", mb=3))
        put_sft(queue, "ps", "s", sig, 8)
        put_rl(queue, "pr", "r", sig, 9)
        jobs = [
            make_job("s", "ps", 8, sig, job_id="js"),
            make_job("r", "pr", 9, sig, TaskType.RL, "jr"),
        ]
        results = await svc.train_jobs_isolated(jobs)
        return {r.tenant_id: r.losses for r in results}  # type: ignore[union-attr]

    plane = build_plane(
        tmp_path / "run",
        BaseModelSpec(id=tiny_model),
        placement=RayPlacement(layout="cpu", role_resources=MULTINODE_ROLES, training_ranks=2),
    )
    try:
        assert isinstance(plane.training, DataParallelRole) and plane.training.world_size == 2
        assert isinstance(plane.hosting, RayHosting)
        nodes = plane.hosting.role_nodes()
        assert nodes["training"] == nodes["training/1"] == multinode_cluster.worker_ids()[0]
        ranked = asyncio.run(train(plane.training, plane.queue, tmp_path))
        local = TrainingModelService(plane.base, TrainingQueue(), output_dir=tmp_path / "one")
        alone = asyncio.run(train(local, local.queue, tmp_path / "one"))
    finally:
        asyncio.run(plane.stop())
        plane.close()
    assert set(ranked) == {"s", "r"}
    for tenant in ("s", "r"):
        assert len(ranked[tenant]) == len(alone[tenant]) >= 2
        np.testing.assert_allclose(ranked[tenant], alone[tenant], rtol=1e-5, atol=1e-7)


# A whole workload on a shared 2-core machine: more than the default 300 s can pass.
@pytest.mark.timeout(900)
def test_roles_on_their_nodes_and_both_worker_nodes_lost_mid_workload(
    multinode_cluster: LocalCluster,
    tmp_path: Path,
    tiny_model: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each role runs on its own node and loads the backbone there. Then both workers'
    Ray processes are killed mid-workload: no live node advertises ``trainer`` or
    ``rollout``, so those bundles wait, with the reason visible; new nodes join, Ray
    re-creates the training actor there (the Master rebuilds its slots from the
    checkpoints), the engine is re-created and synced, and the tenant reaches its
    target with no job completed twice. Runs last: it changes the module's cluster."""
    import time

    import ray

    from joynexus.control.job import JobState
    from joynexus.runtime.ray_cluster import NodeSpec
    from tests.runtime.conftest import MULTINODE_ROLLOUT, MULTINODE_TRAINER

    cluster = multinode_cluster
    trainer_node, rollout_node = cluster.worker_ids()
    head = cluster.head_node_id

    # The driver never serializes the backbone: each node loads it from the model path.
    def refuse(*_: object) -> object:
        raise AssertionError("the resident backbone was serialized by the driver")

    monkeypatch.setattr(ResidentBaseModel, "__reduce_ex__", refuse, raising=False)
    out = tmp_path / "out"
    # One rollout in flight: few jobs are caught by the loss.
    specs = [
        rl_spec(
            "rl", tiny_model, out, target=4, horizon=6, num_envs=2, episode_steps=6, max_in_flight=1
        )
    ]
    run = LocalRun(
        tmp_path / "run",
        placement=RayPlacement(layout="cpu", role_resources=MULTINODE_ROLES),
        health_check_s=0.2,
    )
    drill: dict[str, Any] = {}

    async def lose_then_replace(hosting: RayHosting) -> None:
        drill["placed"] = await asyncio.to_thread(hosting.role_nodes)
        drill["killed_mono"] = time.monotonic()
        drill["killed_at"] = await asyncio.to_thread(cluster.kill_worker, rollout_node)
        await asyncio.to_thread(cluster.kill_worker, trainer_node)
        for _ in range(450):
            drill["waiting"] = await asyncio.to_thread(hosting.waiting_for)
            if len(drill["waiting"]) == 2:
                break
            await asyncio.sleep(0.2)
        drill["seen_waiting_at"] = time.time()
        # Ray starts a node from the main thread only (it installs signal handlers):
        # the loop stands still for the few seconds the node takes to join.
        drill["new_trainer"] = cluster.add_worker(NodeSpec.model_validate(MULTINODE_TRAINER))
        drill["new_node"] = cluster.add_worker(NodeSpec.model_validate(MULTINODE_ROLLOUT))
        drill["added_at"] = time.time()

    def on_progress(rows: list[TenantProgress]) -> None:
        assert run.plane is not None and isinstance(run.plane.hosting, RayHosting)
        if "drill" not in drill and rows[0].completed >= 1:
            drill["drill"] = asyncio.get_running_loop().create_task(
                lose_then_replace(run.plane.hosting)
            )

    def check(run: LocalRun, summary: RunSummary) -> None:
        assert drill["drill"].done() and drill["drill"].exception() is None
        assert drill["placed"] == {
            "training": trainer_node,
            "inference/0": rollout_node,
            "environment": head,
            "training_queue": head,
        }
        assert any("role inference" in w and "rollout" in w for w in drill["waiting"])
        assert any("role actor" in w and "trainer" in w for w in drill["waiting"])
        s = summary.tenants["rl"]
        assert s.state == "completed", s.errors
        assert run.plane is not None and isinstance(run.plane.hosting, RayHosting)
        # The actor loaded the model itself, from the same path the driver did.
        training: Any = run.plane.training
        model_id = ray.get(training.actor.__ray_call__.remote(lambda svc: svc.base.model_id))
        assert model_id == run.plane.base.model_id
        jobs = run.plane.scheduler.list_jobs(tenant_id="rl")
        assert all(j.is_terminal for j in jobs), [(j.job_id, j.state) for j in jobs]
        completed = [j for j in jobs if j.state is JobState.COMPLETED]
        # Exactly the target completed, each once, all in the weights; the jobs that
        # failed were held by the lost actors, or handed to them while they were down.
        assert len(completed) == s.jobs_completed == 4 == s.final_version
        failed = [j for j in jobs if j.state is JobState.FAILED]
        assert len(jobs) == 4 + len(failed)
        print("failed jobs:", [j.terminal_reason for j in failed])
        assert run.plane.queue.partitions() == [] and run.plane.queue.nbytes == 0
        assert run.plane.hosting.waiting_for() == []
        nodes = run.plane.hosting.role_nodes()
        assert nodes["inference/0"] == drill["new_node"]
        assert nodes["training"] == drill["new_trainer"]
        assert "restarted" in [e.kind for e in run.health.events_of("training")]
        assert run.health.escalated is None
        drill["usage"] = run.plane.usage

    run_checked(specs, run, check, on_progress)
    # The plane's usage meter counted the actors' work, on whichever node it ran (the
    # hosting's last collection runs on stop).
    seen = drill["usage"].tenant("rl")
    assert all(seen.device_seconds[s] > 0 for s in ("training", "inference", "environment")), seen
    assert seen.samples_trained > 0 and seen.env_steps > 0
    # Health events carry the monotonic clock: the restart times relative to the loss.
    back = {
        role: round(
            max(e.time for e in run.health.events_of(role) if e.kind == "restarted")
            - drill["killed_mono"],
            1,
        )
        for role in ("training", "inference/0")
    }
    print(
        f"node loss: waiting visible after {drill['seen_waiting_at'] - drill['killed_at']:.1f} s; "
        f"new nodes joined {drill['added_at'] - drill['killed_at']:.1f} s after the loss; "
        f"back after the loss: {back}"
    )
