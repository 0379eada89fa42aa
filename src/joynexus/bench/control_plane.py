"""``joynexus bench control-plane``: the cost of the control plane itself.

Measures, in one run on this machine:

* Training Scheduler transitions per second, in memory and durable (SQLite WAL).
  One SFT job's life is four transitions: reserve, mark ready, lease, complete.
* Training Queue throughput in MB/s for ``queue_put`` and for ``get_meta`` +
  ``get_data`` over float32 columns.
* Inference Queue overhead per request: queue + group-batching cost with a no-op
  batch function, many concurrent submitters, the real clock.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from joynexus.control.admission import AdmissionPolicy
from joynexus.control.scheduler import TrainingScheduler
from joynexus.queues.inference import InferenceQueue, InferenceRequest
from joynexus.queues.training import SampleMeta, TrainingQueue

TRANSITIONS_PER_JOB = 4  # reserve, ready, leased, completed


def _scheduler_cycles(scheduler: TrainingScheduler, num_jobs: int) -> float:
    """Run ``num_jobs`` full SFT lifecycles; return transitions per second."""
    scheduler.set_policy("bench", "sft", AdmissionPolicy(max_in_flight=None))
    start = time.perf_counter()
    for _ in range(num_jobs):
        job = scheduler.reserve(
            policy_key="bench/sft",
            domain="vla",
            tenant_id="bench",
            task_type="sft",
            sample_count=1,
            producer_role="sft",
            consumer_role="actor",
            metadata={"schema_signature": "sig-bench"},
        )
        assert job is not None
        scheduler.mark(job.job_id, "ready")
        leased = scheduler.lease_next("actor", ["vla"])
        assert leased is not None
        scheduler.complete(leased.job_id, leased.lease_epoch)
    elapsed = time.perf_counter() - start
    return num_jobs * TRANSITIONS_PER_JOB / elapsed


def bench_scheduler(num_jobs: int) -> dict[str, float]:
    """In-memory and durable transitions per second."""
    memory = TrainingScheduler.in_memory()
    try:
        mem_rate = _scheduler_cycles(memory, num_jobs)
    finally:
        memory.close()
    with tempfile.TemporaryDirectory() as tmp:
        durable = TrainingScheduler.open(Path(tmp) / "scheduler.sqlite")
        try:
            # Durable commits are ~10x dearer; fewer jobs keep the run short.
            durable_rate = _scheduler_cycles(durable, max(1, num_jobs // 5))
        finally:
            durable.close()
    return {"memory_transitions_per_s": mem_rate, "durable_transitions_per_s": durable_rate}


def bench_training_queue(total_mb: int, batch_samples: int = 256) -> dict[str, float]:
    """MB/s of ``queue_put`` and of ``get_meta`` + ``get_data``."""
    row_floats = 4096  # 16 KiB per sample
    rows_per_put = 1024
    num_puts = max(1, (total_mb * 2**20) // (rows_per_put * row_floats * 4))
    rng = np.random.default_rng(0)
    chunk = rng.standard_normal((rows_per_put, row_floats), dtype=np.float32)
    meta = SampleMeta(tenant_id="bench", schema_signature="sig-bench")
    # Distinct, already-touched source buffers, made before the clock starts: the
    # benchmark measures the queue, not the producer's allocation.
    sources = [chunk + np.float32(i) for i in range(num_puts)]
    queue = TrainingQueue()
    start = time.perf_counter()
    for i, source in enumerate(sources):
        queue.queue_put(f"part-{i % 4}", {"obs": source}, meta)
    put_s = time.perf_counter() - start
    nbytes = num_puts * chunk.nbytes
    del sources
    start = time.perf_counter()
    got = 0
    for p in range(min(4, num_puts)):
        while True:
            batch_meta = queue.get_meta(f"part-{p}", ["obs"], batch_samples, "bench")
            if not batch_meta.indexes:
                break
            data = queue.get_data(batch_meta)
            got += int(np.asarray(data["obs"]).nbytes)
    get_s = time.perf_counter() - start
    mb = 2**20
    return {"put_mb_per_s": nbytes / mb / put_s, "get_mb_per_s": got / mb / get_s}


async def _inference_overhead(num_requests: int, submitters: int) -> float:
    async def noop_batch(requests: list[InferenceRequest]) -> list[Any]:
        return [None] * len(requests)

    queue = InferenceQueue(noop_batch, max_batch_size=64, max_wait_s=0.001)
    per_submitter = num_requests // submitters

    async def submitter(k: int) -> None:
        for i in range(per_submitter):
            await queue.submit(
                InferenceRequest(
                    tenant_id=f"t{k % 8}",
                    session_id=f"s{k}",
                    schema_signature="sig-bench",
                    policy_version=0,
                    observation=i,
                    compat_key="prefix-bench",
                )
            )

    async with queue:
        start = time.perf_counter()
        await asyncio.gather(*(submitter(k) for k in range(submitters)))
        elapsed = time.perf_counter() - start
    return elapsed / (per_submitter * submitters) * 1e6


def bench_inference_queue(num_requests: int, submitters: int = 64) -> dict[str, float]:
    """Microseconds of queue + scheduling cost per request (no-op batch function)."""
    return {"overhead_us_per_request": asyncio.run(_inference_overhead(num_requests, submitters))}


def run_control_plane_bench(*, quick: bool = False, progress: bool = False) -> dict[str, Any]:
    """Run every control-plane benchmark; returns the nested results dict.

    Args:
        quick: Small iteration counts (seconds), for smoke tests; figures are noisier.
        progress: Show a progress bar on the terminal.
    """
    steps: list[tuple[str, Callable[[], dict[str, float]]]] = [
        ("scheduler", lambda: bench_scheduler(500 if quick else 10_000)),
        ("training_queue", lambda: bench_training_queue(8 if quick else 256)),
        ("inference_queue", lambda: bench_inference_queue(1_024 if quick else 20_000)),
    ]
    results: dict[str, Any] = {}
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("control-plane bench", total=len(steps))
        for name, fn in steps:
            bar.update(task, description=f"bench {name}")
            results[name] = fn()
            bar.advance(task)
    results["config"] = {"quick": quick}
    return results


TARGETS: dict[tuple[str, str], tuple[str, float]] = {
    ("scheduler", "memory_transitions_per_s"): (">=", 20_000.0),
    ("scheduler", "durable_transitions_per_s"): (">=", 2_000.0),
    ("inference_queue", "overhead_us_per_request"): ("<=", 200.0),
}


def print_table(results: dict[str, Any], console: Console) -> None:
    """Render the results with their targets as a rich table."""
    table = Table(title="JoyNexus control plane")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_column("met", justify="center")
    for group, values in results.items():
        if group == "config":
            continue
        for key, value in values.items():
            target = TARGETS.get((group, key))
            if target is None:
                target_s, met = "", ""
            else:
                op, bound = target
                ok = value >= bound if op == ">=" else value <= bound
                target_s, met = f"{op} {bound:,.0f}", "yes" if ok else "NO"
            table.add_row(f"{group}.{key}", f"{value:,.1f}", target_s, met)
    console.print(table)
