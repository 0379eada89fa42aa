"""Control signals: scheduler job states, queue depth, in-flight requests, staleness."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from joynexus.control.job import TaskType
from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import NotFoundError
from joynexus.metrics.control import ControlSampler
from joynexus.metrics.events import MetricsService
from joynexus.queues.inference import InferenceQueue, InferenceRequest
from joynexus.queues.meta import SampleMeta
from joynexus.queues.training import TrainingQueue
from joynexus.utils.clock import FakeClock
from tests.control.conftest import make_ready, reserve


def versions(latest: dict[str, int]) -> Any:
    def get(tenant: str) -> int:
        if tenant not in latest:
            raise NotFoundError(f"no tenant {tenant!r}")
        return latest[tenant]

    return get


def test_scheduler_and_training_queue_signals_with_staleness() -> None:
    sched = TrainingScheduler.in_memory(clock=FakeClock())
    # Tenant a: two ready RL jobs collected at behaviour versions 2 then 4.
    old = make_ready(sched, reserve(sched, "a", TaskType.RL, behavior_policy_version=2))
    make_ready(sched, reserve(sched, "a", TaskType.RL, behavior_policy_version=4))
    # Tenant b: one ready SFT job and one still reserved RL job.
    make_ready(sched, reserve(sched, "b", TaskType.SFT))
    reserve(sched, "b", TaskType.RL, behavior_policy_version=0)
    # Tenant c: unknown to the trainer (no staleness reported).
    make_ready(sched, reserve(sched, "c", TaskType.RL, behavior_policy_version=0))
    queue = TrainingQueue()
    queue.queue_put(
        old.partition_id,
        {"x": np.zeros((4, 8), np.float32)},
        SampleMeta(tenant_id="a", schema_signature="sig-a"),
    )

    metrics = MetricsService()
    sampler = ControlSampler(
        metrics,
        scheduler=sched,
        training_queue=queue,
        policy_version=versions({"a": 5, "b": 3}),
    )
    snap = sampler.poll()
    assert snap.jobs_by_tenant["a"]["ready"] == 2
    assert {k: n for k, n in snap.jobs_by_tenant["b"].items() if n} == {"ready": 1, "reserved": 1}
    assert snap.jobs_by_state["ready"] == 4 and snap.jobs_by_state["reserved"] == 1
    # Staleness is measured against the OLDEST ready RL job: 5 - 2.
    assert snap.policy_staleness == {"a": 3, "b": 0}
    assert snap.training_queue_partitions == 1 and snap.training_queue_bytes == 4 * 8 * 4
    assert snap.inference_queue_depth is None

    metrics.drain()
    assert metrics.latest("policy_staleness", tenant_id="a").value == 3  # type: ignore[union-attr]
    ready_a = metrics.latest("scheduler.jobs", tenant_id="a", labels={"state": "ready"})
    assert ready_a is not None and ready_a.value == 2
    leased_a = metrics.latest("scheduler.jobs", tenant_id="a", labels={"state": "leased"})
    assert leased_a is not None and leased_a.value == 0  # zero states are reported too
    text = metrics.render_latest().decode()
    assert 'joynexus_control_policy_staleness{tenant="a"} 3.0' in text
    assert "joynexus_control_training_queue_bytes 128.0" in text
    # Job counts per tenant only: their sum is the service-wide count, counted once.
    assert 'tenant=""' not in text and metrics.latest("scheduler.jobs") is None
    ready = [
        line
        for line in text.splitlines()
        if line.startswith("joynexus_control_scheduler_jobs{") and 'state="ready"' in line
    ]
    assert sum(float(line.split()[-1]) for line in ready) == snap.jobs_by_state["ready"] == 4

    # The staleness follows the trainer's version.
    sampler.policy_version = versions({"a": 9, "b": 3})
    assert sampler.poll().policy_staleness["a"] == 7


def test_inference_queue_depth_and_in_flight() -> None:
    async def main() -> None:
        gate = asyncio.Event()

        async def batch_fn(requests: Sequence[InferenceRequest]) -> list[int]:
            await gate.wait()
            return [0] * len(requests)

        metrics = MetricsService()
        async with InferenceQueue(batch_fn, max_batch_size=1, max_wait_s=0.0) as q:
            sampler = ControlSampler(metrics, inference_metrics=lambda: q.metrics)
            futures = [
                q.enqueue(InferenceRequest("a", "s", "sig", None, None, compat_key="k"))
                for _ in range(3)
            ]
            for _ in range(100):
                if q.metrics.batches:
                    break
                await asyncio.sleep(0)
            snap = sampler.poll()
            assert snap.inference_queue_depth == 2  # one batch of B=1 is running
            assert snap.inference_in_flight == 3  # accepted and unanswered
            gate.set()
            await asyncio.gather(*futures)
            snap = sampler.poll()
            assert (snap.inference_queue_depth, snap.inference_in_flight) == (0, 0)
            explicit = ControlSampler(
                metrics, inference_metrics=lambda: q.metrics, inference_in_flight=lambda: 7
            )
            assert explicit.poll().inference_in_flight == 7
        metrics.drain()
        depth = metrics.latest("inference_queue.depth", category="control")
        assert depth is not None and depth.value == 0

    asyncio.run(main())
