"""The real services report usage and events: inference, training, environment."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from joynexus.control.job import JobState, JobTimestamps, TaskType, TrainingJob
from joynexus.envs.base import EnvSpec
from joynexus.metrics.events import MetricEvent, MetricsService
from joynexus.metrics.usage import UsageMeter
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.queues.meta import SampleMeta
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.samples import camera_field, instructions_array
from joynexus.services.tenancy import TenantConfig
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import AlgorithmSpec

SCHEMA = DataSchema(
    name="tiny",
    cameras={"cam": CameraSpec(height=32, width=32)},
    state_dim=3,
    action_dim=2,
    action_chunk=2,
    instruction="do the fake thing",
)
OFT = OFTHeadConfig(hidden_dim=32, num_blocks=1)


def config(tid: str, out: Path = Path(".")) -> TenantConfig:
    return TenantConfig(
        tenant_id=tid,
        schema_=SCHEMA,
        head=OFT,
        algorithm=AlgorithmSpec(name="sft", microbatch_size=2),
        seed=0,
        output_dir=out,
    )


def collected(metrics: MetricsService) -> list[MetricEvent]:
    events: list[MetricEvent] = []
    metrics.subscribe(events.append)
    return events


def test_inference_batches_are_metered_per_tenant(base: ResidentBaseModel) -> None:
    metrics, usage = MetricsService(), UsageMeter()
    events = collected(metrics)

    async def main() -> InferenceModelService:
        svc = InferenceModelService(
            base,
            EnvironmentService(),
            TrainingQueue(),
            max_batch_size=3,
            max_wait_s=5.0,  # the batch fires when full: A's 2 rows + B's 1 row
            metrics=metrics,
            usage=usage,
        )
        async with svc:
            for tid in ("A", "B", "idle"):
                await svc.add_tenant(config(tid))
            obs_a = ObservationBatch.synthetic(SCHEMA, 2, seed=0, with_actions=False)
            obs_b = ObservationBatch.synthetic(SCHEMA, 1, seed=1, with_actions=False)
            await asyncio.gather(svc.predict(obs_a, "A"), svc.predict(obs_b, "B"))
            assert svc.in_flight == 0
            await svc.load_weights(
                "A", 1, {n: t + 0.1 for n, t in svc.serving_slot("A").state_tensors().items()}
            )
        return svc

    svc = asyncio.run(main())
    assert svc.metrics.batches == 1  # one grouped forward served both tenants
    report = usage.snapshot()
    a, b = report.tenants["A"], report.tenants["B"]
    assert (a.requests, a.inference_samples) == (1, 2)
    assert (b.requests, b.inference_samples) == (1, 1)
    assert "idle" not in report.tenants
    total = report.service_seconds["inference"]
    assert total > 0
    assert a.device_seconds["inference"] == pytest.approx(total * 2 / 3)
    assert b.device_seconds["inference"] == pytest.approx(total / 3)
    assert a.device_seconds["training"] == 0.0

    metrics.drain()
    names = {(e.name, e.tenant_id) for e in events}
    assert ("inference.batch_latency_s", None) in names
    assert ("inference.weight_sync_s", "A") in names
    sizes = [e.value for e in events if e.name == "inference.batch_size"]
    assert sizes == [3.0]
    assert b"joynexus_system_inference_batch_latency_s_count" in metrics.render_latest()


def _put_sft(queue: TrainingQueue, pid: str, tid: str, sig: str, n: int, seed: int) -> None:
    batch = ObservationBatch.synthetic(SCHEMA, n, seed=seed)
    assert batch.actions is not None
    cols = {camera_field(c): batch.cameras[c] for c in SCHEMA.camera_names}
    cols["state"] = batch.state
    cols["instruction"] = instructions_array(batch.instructions)
    cols["actions"] = batch.actions
    queue.queue_put(pid, cols, SampleMeta(tenant_id=tid, schema_signature=sig))


def _job(tid: str, pid: str, n: int) -> TrainingJob:
    return TrainingJob(
        job_id=f"job-{tid}",
        policy_key=f"{tid}/sft",
        tenant_id=tid,
        task_type=TaskType.SFT,
        partition_id=pid,
        sample_count=n,
        domain="d",
        created_seq=1,
        producer_role="sft",
        consumer_role="actor",
        state=JobState.LEASED,
        timestamps=JobTimestamps(created_at=0.0, updated_at=0.0),
    )


def test_training_steps_are_metered_and_report_learning_signals(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    metrics, usage = MetricsService(), UsageMeter()
    events = collected(metrics)
    queue = TrainingQueue()
    svc = TrainingModelService(base, queue, output_dir=tmp_path, metrics=metrics, usage=usage)

    async def main() -> None:
        for tid in ("A", "B"):
            await svc.add_tenant(config(tid, tmp_path))
        sig = svc.slot("A").schema_signature
        _put_sft(queue, "pa", "A", sig, 4, seed=0)  # 2 microbatches of 2
        _put_sft(queue, "pb", "B", sig, 2, seed=1)  # 1 microbatch of 2
        await svc.train_jobs([_job("A", "pa", 4), _job("B", "pb", 2)])

    asyncio.run(main())
    report = usage.snapshot()
    a, b = report.tenants["A"], report.tenants["B"]
    assert (a.samples_trained, b.samples_trained) == (4, 2)
    assert a.device_seconds["training"] > 0 and b.device_seconds["training"] > 0
    attributed = a.device_seconds["training"] + b.device_seconds["training"]
    assert attributed == pytest.approx(report.service_seconds["training"])
    assert a.device_seconds["inference"] == 0.0

    metrics.drain()
    losses = [(e.tenant_id, e.step) for e in events if e.name == "train.loss"]
    # One loss per optimizer step, tagged with the tenant and its version after the step.
    assert sorted(losses, key=str) == [("A", 1), ("A", 2), ("B", 1)]
    assert all(e.category == "learning" for e in events if e.name.startswith("train."))
    rows = [e.value for e in events if e.name == "training.step_rows"]
    assert rows == [4.0, 2.0]  # step 1 grouped A+B, step 2 only A


def test_environment_steps_are_metered_per_tenant() -> None:
    metrics, usage = MetricsService(), UsageMeter()
    events = collected(metrics)

    async def main() -> None:
        env = EnvironmentService(metrics=metrics, usage=usage)
        try:
            info = await env.create_session("A", EnvSpec(kind="fake", num_envs=2, image_size=4))
            await env.reset(info.session_id, "r1", seed=0, tenant_id="A")
            for _ in range(3):
                await env.step(info.session_id, np.zeros((2, 2), np.float32), tenant_id="A")
        finally:
            await env.aclose()

    asyncio.run(main())
    a = usage.tenant("A")
    assert a.env_steps == 6  # 3 steps x 2 sub-envs
    assert a.device_seconds["environment"] > 0
    assert usage.snapshot().service_seconds["environment"] == pytest.approx(
        a.device_seconds["environment"]
    )
    metrics.drain()
    assert [e.tenant_id for e in events if e.name == "env.step_latency_s"] == ["A"] * 3
    # Each step's simulator run-queue wait comes just before its latency, from the worker.
    names = [e.name for e in events if e.name.startswith("env.step_")]
    assert names == ["env.step_wait_s", "env.step_latency_s"] * 3
    waits = [e.value for e in events if e.name == "env.step_wait_s"]
    assert all(w >= 0.0 for w in waits)
