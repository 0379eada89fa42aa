"""The workflow loops over the real services, stepped one iteration at a time.

* the optional actor-forward stage: ``hand_off → lease_stage(reserved →
  computing_actor_forward) → actor_forward → needs_advantages → computing_advantages →
  ready → leased → completed``;
* actor consumer groups: ready jobs of different tenants leased together, trained with
  one grouped backbone forward per microbatch, each completed (or failed) on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joynexus.control.job import JobState, TrainingJob
from joynexus.control.scheduler import TrainingScheduler
from joynexus.envs import env_schema
from joynexus.errors import ServiceUnavailableError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.payload import find_latest_checkpoint, read_manifest
from joynexus.models.types import BackboneOutput
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.tenancy import TenantConfig
from joynexus.services.training import TrainingModelService
from joynexus.utils.clock import FakeClock
from joynexus.workflows.actor import consume_training_job, consume_training_jobs
from joynexus.workflows.context import MetricsLog, WorkflowContext, WorkflowTenant
from joynexus.workflows.rl import produce_rl
from joynexus.workflows.stages import actor_forward_once, advantage_once
from tests.workflows.helpers import rl_spec

NUM_ENVS, HORIZON, MICROBATCH = 2, 4, 4  # 8 samples per job: 2 microbatches


@dataclass
class Plane:
    ctx: WorkflowContext
    training: TrainingModelService
    inference: InferenceModelService
    env: EnvironmentService
    tenants: dict[str, WorkflowTenant]


async def _plane(base: ResidentBaseModel, out: Path, tenants: list[str], **algo: Any) -> Plane:
    queue = TrainingQueue()
    env = EnvironmentService()
    training = TrainingModelService(base, queue, output_dir=out)
    inference = InferenceModelService(base, env, queue)
    await inference.start()
    workflow_tenants: dict[str, WorkflowTenant] = {}
    for i, tid in enumerate(tenants):
        spec = rl_spec(
            tid,
            "unused",
            out,
            num_envs=NUM_ENVS,
            horizon=HORIZON,
            extra_algo={"microbatch_size": MICROBATCH, **algo},
            seed=i,
        )
        assert spec.env is not None
        schema = env_schema(spec.env)
        config = TenantConfig.from_spec(spec, schema)
        info = await training.add_tenant(config)
        await inference.add_tenant(config, await training.export_params(tid))
        session = await env.create_session(tid, spec.env)
        workflow_tenants[tid] = WorkflowTenant(
            spec=spec,
            schema=schema,
            schema_signature=info.schema_signature,
            config=config,
            metrics=MetricsLog(None, FakeClock()),
            session_id=session.session_id,
        )
    ctx = WorkflowContext(
        scheduler=TrainingScheduler.in_memory(clock=FakeClock()),
        queue=queue,
        training=training,
        inference=inference,
        clock=FakeClock(),
        tenants=workflow_tenants,
    )
    return Plane(ctx, training, inference, env, workflow_tenants)


async def _close(plane: Plane) -> None:
    await plane.inference.stop()
    await plane.env.aclose()


@pytest.fixture
def base(tiny_backbone: Any) -> Iterator[ResidentBaseModel]:
    backbone: ResidentBaseModel = tiny_backbone("qwen2_5_vl")
    yield backbone


def _only_job(plane: Plane, tenant: str) -> Any:
    jobs = plane.ctx.scheduler.list_jobs(tenant_id=tenant)
    assert len(jobs) == 1
    return jobs[0]


def test_actor_forward_stage_through_the_workflows(base: ResidentBaseModel, tmp_path: Path) -> None:
    async def main() -> None:
        plane = await _plane(base, tmp_path, ["af"], actor_forward=True)
        ctx, sched, queue = plane.ctx, plane.ctx.scheduler, plane.ctx.queue
        try:
            assert await produce_rl(ctx, plane.tenants["af"]) is None
            job = _only_job(plane, "af")
            # hand_off: still reserved, but no producer lease any more.
            assert job.state is JobState.RESERVED and not job.has_lease
            assert "actor_log_probs" not in queue.info(job.partition_id).fields

            forwarded = await actor_forward_once(ctx)
            assert forwarded is not None and forwarded.job_id == job.job_id
            assert forwarded.state is JobState.NEEDS_ADVANTAGES
            assert forwarded.lease_epoch > job.lease_epoch  # it was leased by the stage
            meta = queue.get_meta(
                job.partition_id, ["log_probs", "actor_log_probs", "actor_values"], 64, "chk"
            )
            data = queue.get_data(meta)
            # Same version as the behaviour policy: the recomputed log-probs agree.
            np.testing.assert_allclose(
                np.asarray(data["actor_log_probs"]), np.asarray(data["log_probs"]), atol=1e-4
            )
            assert await actor_forward_once(ctx) is None  # nothing else handed off

            ready = await advantage_once(ctx)
            assert ready is not None and ready.state is JobState.READY
            assert {"advantages", "returns"} <= set(queue.info(job.partition_id).fields)

            done = await consume_training_job(ctx)
            assert done is not None and done.state is JobState.COMPLETED
            assert plane.training.policy_version("af") == 2  # 8 samples / microbatch 4
            assert plane.inference.current_policy_version("af") == 2
            assert not queue.has_partition(job.partition_id)
            assert sched.get(job.job_id).metadata["actor_versions"] == {"af": 2}
        finally:
            await _close(plane)

    asyncio.run(main())


def _record_forwards(training: TrainingModelService) -> list[set[str]]:
    calls: list[set[str]] = []
    executor = training._executor
    original = executor.shared_forward

    def spy(batches: dict[str, ObservationBatch], **kw: Any) -> dict[str, BackboneOutput]:
        calls.append(set(batches))
        return original(batches, **kw)

    executor.shared_forward = spy  # type: ignore[method-assign]
    return calls


async def _ready_jobs(plane: Plane, per_tenant: dict[str, int]) -> None:
    for tid, count in per_tenant.items():
        for _ in range(count):
            assert await produce_rl(plane.ctx, plane.tenants[tid]) is None
            assert await advantage_once(plane.ctx) is not None


def test_actor_groups_jobs_of_different_tenants(base: ResidentBaseModel, tmp_path: Path) -> None:
    async def main() -> None:
        plane = await _plane(base, tmp_path, ["a", "b"])
        try:
            # a has two ready jobs: the second is carried past the group and consumed
            # alone afterwards (a tenant's updates are sequential).
            await _ready_jobs(plane, {"a": 2, "b": 1})
            forwards = _record_forwards(plane.training)
            finished = await consume_training_jobs(plane.ctx)
            assert [j.state for j in finished] == [JobState.COMPLETED] * 3
            assert [j.tenant_id for j in finished] == ["a", "b", "a"]
            # Two microbatches of the group share forwards, then a's second job alone.
            assert forwards == [{"a", "b"}, {"a", "b"}, {"a"}, {"a"}]
            assert plane.training.policy_version("a") == 4
            assert plane.training.policy_version("b") == 2
            assert plane.inference.current_policy_version("a") == 4
            assert plane.inference.current_policy_version("b") == 2
            assert await consume_training_jobs(plane.ctx) == []
        finally:
            await _close(plane)

    asyncio.run(main())


def test_a_failing_job_fails_alone_in_its_group(base: ResidentBaseModel, tmp_path: Path) -> None:
    async def main() -> None:
        plane = await _plane(base, tmp_path, ["a", "b"])
        try:
            await _ready_jobs(plane, {"a": 1, "b": 1})
            broken = _only_job(plane, "b")
            plane.ctx.queue.clear(broken.partition_id)  # b's data is gone
            finished = {j.tenant_id: j for j in await consume_training_jobs(plane.ctx)}
            assert finished["a"].state is JobState.COMPLETED
            assert finished["b"].state is JobState.FAILED
            assert plane.training.policy_version("a") == 2
            assert plane.training.policy_version("b") == 0
            assert plane.tenants["b"].errors and not plane.tenants["a"].errors
        finally:
            await _close(plane)

    asyncio.run(main())


@pytest.mark.parametrize("knows_checkpoints", [True, False])
def test_a_job_whose_update_was_checkpointed_completes_even_if_publication_fails(
    base: ResidentBaseModel, tmp_path: Path, knows_checkpoints: bool
) -> None:
    """The checkpoint is an update's commit point: the training role dying while it
    publishes (after the save) cannot take the update back, so the job completes and
    completed jobs stay exactly the updates a restart restores."""

    def in_checkpoint(job: TrainingJob) -> bool:
        latest = find_latest_checkpoint(tmp_path, job.tenant_id)
        return latest is not None and read_manifest(latest).ledger.get("job_id") == job.job_id

    async def main() -> None:
        plane = await _plane(base, tmp_path, ["a"])
        plane.ctx.durable_checkpoints = True
        plane.ctx.in_checkpoint = in_checkpoint if knows_checkpoints else None
        try:
            await _ready_jobs(plane, {"a": 1})

            async def dead(*_: object) -> None:
                raise ServiceUnavailableError("the training actor died")

            plane.training.export_params = dead  # type: ignore[method-assign,assignment]
            with pytest.raises(ServiceUnavailableError):
                await consume_training_job(plane.ctx)
            job = _only_job(plane, "a")
            latest = find_latest_checkpoint(tmp_path, "a")
            assert latest is not None and read_manifest(latest).ledger["job_id"] == job.job_id
            if knows_checkpoints:
                assert job.state is JobState.COMPLETED
                assert not plane.tenants["a"].errors
            else:  # nothing tells the actor that the update is durable
                assert job.state is JobState.FAILED
        finally:
            await _close(plane)

    asyncio.run(main())
