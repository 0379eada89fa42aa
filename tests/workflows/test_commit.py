"""An SFT job's commit behind the tenant's next update (``WorkflowContext.overlap_updates``).

On the fake plane (the real scheduler, queue and checkpoint layout; fake model
services), with the Master's durability on: every update is checkpointed before it is
served or its job completes. A gate holds the first job's checkpoint write until the
tenant's next job has started training, so the test fails (times out) wherever the
commit still runs in front of the next update.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from joynexus.control.job import JobState, TaskType, TrainingJob
from joynexus.control.scheduler import TrainingScheduler
from joynexus.queues.training import TrainingQueue
from joynexus.utils.clock import FakeClock
from joynexus.workflows.actor import consume_training_job
from joynexus.workflows.commit import drain_behind
from joynexus.workflows.context import (
    ACTOR_ROLE,
    SFT_ROLE,
    STORAGE_FULL_REASON,
    MetricsLog,
    WorkflowContext,
    WorkflowTenant,
)
from tests.contracts.conftest import SCHEMA, put_samples, tenant_config
from tests.fakes.base import FakeBase
from tests.fakes.environment import FakeEnvironmentService
from tests.fakes.inference import FakeInferenceService
from tests.fakes.training import STATE_FILE, FakeTrainingService, checkpointed_state
from tests.workflows.helpers import spec

TID, SAMPLES = "a", 4


async def _context(out: Path, *, overlap: bool) -> tuple[WorkflowContext, FakeTrainingService]:
    base, queue = FakeBase(), TrainingQueue()
    training = FakeTrainingService(base, queue, output_dir=out)
    inference = FakeInferenceService(base, FakeEnvironmentService(), queue)
    config = tenant_config(TID, out, mb=SAMPLES)
    info = await training.add_tenant(config)
    await inference.add_tenant(config, await training.export_params(TID))
    workload = spec(
        {
            "tenant": TID,
            "task": "sft",
            "base_model": {"id": "tiny:qwen2_5_vl"},
            "dataset": {"path": str(out / "data")},
            "action_module": {"type": "oft"},
            "algorithm": {"name": "sft", "samples_per_job": SAMPLES},
            "scheduling": {"completion_target": 10, "max_in_flight": 4, "prefetch": 4},
        }
    )
    tenant = WorkflowTenant(
        spec=workload,
        schema=SCHEMA,
        schema_signature=info.schema_signature,
        config=config,
        metrics=MetricsLog(None, FakeClock()),
        serve=True,  # an evaluation reads it: every version is published too
    )
    ctx = WorkflowContext(
        scheduler=TrainingScheduler.in_memory(clock=FakeClock()),
        queue=queue,
        training=training,
        inference=inference,
        clock=FakeClock(),
        tenants={TID: tenant},
        durable_checkpoints=True,
        overlap_updates=overlap,
    )
    return ctx, training


def _ready_sft_job(ctx: WorkflowContext) -> TrainingJob:
    tenant = ctx.tenants[TID]
    job = ctx.scheduler.reserve(
        policy_key=f"{TID}/sft",
        domain=ctx.domain,
        tenant_id=TID,
        task_type=TaskType.SFT,
        sample_count=SAMPLES,
        behavior_policy_version=None,
        producer_role=SFT_ROLE,
        consumer_role=ACTOR_ROLE,
        metadata=tenant.job_metadata(),
    )
    assert job is not None
    put_samples(ctx.queue, job.partition_id, TID, tenant.schema_signature, SAMPLES)  # type: ignore[arg-type]
    return ctx.scheduler.mark(job.job_id, JobState.READY, lease_epoch=job.lease_epoch)


def test_an_sft_update_commits_behind_the_next_one_in_order_and_durably(tmp_path: Path) -> None:
    async def main() -> None:
        ctx, training = await _context(tmp_path, overlap=True)
        jobs = [_ready_sft_job(ctx) for _ in range(3)]
        states: dict[str, JobState] = {}
        write, train = training.write_staged, training.train_job
        release = asyncio.Event()

        async def gated_write(token: str) -> list[Path]:
            if training.trained and training.trained[-1][1] == jobs[1].job_id:
                await release.wait()  # job 1's checkpoint waits for job 2's training
            return await write(token)

        async def watched_train(job: TrainingJob, **kw: Any) -> Any:
            if job.job_id == jobs[2].job_id:
                states["job 1 as job 2 starts"] = ctx.scheduler.get(jobs[1].job_id).state
                release.set()
            return await train(job, **kw)

        training.write_staged = gated_write  # type: ignore[method-assign]
        training.train_job = watched_train  # type: ignore[method-assign]
        first = await asyncio.wait_for(consume_training_job(ctx), 10)
        assert first is not None and first.state is JobState.LEASED  # committing behind
        for _ in range(2):
            await asyncio.wait_for(consume_training_job(ctx), 10)
        await asyncio.wait_for(drain_behind(ctx), 10)

        assert states == {"job 1 as job 2 starts": JobState.LEASED}
        done = [ctx.scheduler.get(j.job_id) for j in jobs]
        assert [j.state for j in done] == [JobState.COMPLETED] * 3
        # Job 1's checkpoint holds version 2's weights, though the slot had trained job
        # 2 on before it was written; the ledger counts the updates in order.
        staged = json.loads((tmp_path / TID / "step_2" / STATE_FILE).read_text())
        assert staged["version"] == 2
        assert staged["applied"] == [jobs[0].job_id, jobs[1].job_id]
        state = checkpointed_state(tmp_path, TID)
        assert state is not None
        assert state["applied"] == [j.job_id for j in jobs]
        assert state["ledger"]["job_id"] == jobs[2].job_id
        assert state["ledger"]["jobs_applied"] == 3
        assert ctx.tenants[TID].jobs_applied == 3
        # Published only once written: inference serves the last committed version.
        assert ctx.inference.current_policy_version(TID) == training.policy_version(TID) == 3

    asyncio.run(main())


def test_without_overlap_the_commit_runs_in_front(tmp_path: Path) -> None:
    async def main() -> None:
        ctx, _ = await _context(tmp_path, overlap=False)
        job = _ready_sft_job(ctx)
        first = await consume_training_job(ctx)
        assert first is not None and first.state is JobState.COMPLETED
        assert not ctx.commits_behind
        assert ctx.scheduler.get(job.job_id).state is JobState.COMPLETED

    asyncio.run(main())


def test_a_failed_commit_behind_fails_the_update_trained_across_it(tmp_path: Path) -> None:
    """Job 1's write finds the disk full after job 2 started training on job 1's
    weights: both fail ``storage_full`` (not counted against the workload), and the slot
    and inference are back at job 0's checkpoint — completed jobs are exactly the
    updates in the weights."""

    async def main() -> None:
        ctx, training = await _context(tmp_path, overlap=True)
        jobs = [_ready_sft_job(ctx) for _ in range(3)]
        write, train = training.write_staged, training.train_job
        release = asyncio.Event()

        async def full_disk(token: str) -> list[Path]:
            if training.trained and training.trained[-1][1] == jobs[1].job_id:
                await release.wait()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path))
            return await write(token)

        async def watched_train(job: TrainingJob, **kw: Any) -> Any:
            if job.job_id == jobs[2].job_id:
                release.set()
            return await train(job, **kw)

        training.write_staged = full_disk  # type: ignore[method-assign]
        training.train_job = watched_train  # type: ignore[method-assign]
        for _ in range(3):
            try:
                await asyncio.wait_for(consume_training_job(ctx), 10)
            except Exception as error:  # the actor loop logs and goes on
                assert "could not be checkpointed" in str(error)
        await asyncio.wait_for(drain_behind(ctx), 10)

        done = [ctx.scheduler.get(j.job_id) for j in jobs]
        assert [j.state for j in done] == [
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.FAILED,
        ]
        assert [j.terminal_reason for j in done[1:]] == [STORAGE_FULL_REASON] * 2
        state = checkpointed_state(tmp_path, TID)
        assert state is not None and state["applied"] == [jobs[0].job_id]
        assert training.policy_version(TID) == state["version"] == 1
        assert ctx.inference.current_policy_version(TID) == 1
        assert ctx.tenants[TID].fault is not None

    asyncio.run(main())


@pytest.mark.parametrize("overlap", [True, False])
def test_commits_behind_end_when_the_actor_stops(tmp_path: Path, overlap: bool) -> None:
    async def main() -> None:
        from joynexus.workflows.actor import actor_consumer

        ctx, _ = await _context(tmp_path, overlap=overlap)
        ctx.actor_group_size = 1
        jobs = [_ready_sft_job(ctx) for _ in range(2)]
        actor = asyncio.ensure_future(actor_consumer(ctx))
        while ctx.scheduler.get(jobs[1].job_id).state in (JobState.READY,):
            await asyncio.sleep(0)
        actor.cancel()
        with pytest.raises(asyncio.CancelledError):
            await actor
        assert not ctx.commits_behind
        for job in jobs:
            assert ctx.scheduler.get(job.job_id).is_terminal

    asyncio.run(main())
