"""``joynexus bench backbone-lock``: what training and inference sharing one backbone costs.

In one process (as ``joynexus serve`` and ``joynexus run`` host the plane) the Training
and Inference Model Services run torch on the resident backbone under its one lock, so a
training step and a grouped predict never overlap. This bench runs the same mixture
three times, side by side in one run:

* **shared**: both services on one resident backbone (``--inference-backbone shared``,
  the default), its lock a :class:`~joynexus.utils.priority_lock.PriorityRLock`: predict
  batches go before a waiting training step, and a running step yields to them between
  its phases;
* **shared-plain**: the same with the lock as a plain reentrant lock (no priorities, no
  yields: a predict that arrives during a step waits for the whole step);
* **copy**: the inference service on its own resident copy with its own lock
  (``--inference-backbone copy``), which is what separate services (the paper's
  deployment, or the Ray placement) give.

The mixture: one tenant trains SFT steps back to back (``train_batch``, ``batch`` rows
each) while ``clients`` closed-loop clients of other tenants call ``predict``. Reported
per side: predicts/s, p50 / p99 latency, the mean time a batch waited for the backbone
lock, training steps/s and the backbone bytes resident; ratios are copy ÷ shared and
shared ÷ shared-plain (what the priorities buy).
Everything runs on a model built locally by :func:`joynexus.models.tiny.make_tiny`.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from joynexus.metrics.events import MetricsService
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.models.tiny import TinySize, make_tiny, quiet_transformers
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.tenancy import TenantConfig, backbone_lock
from joynexus.services.training import TrainBatch, TrainingModelService

__all__ = ["print_report", "run_backbone_lock_bench"]

SCHEMA = DataSchema(
    name="lock-bench",
    cameras={"cam": CameraSpec(height=32, width=32)},
    state_dim=4,
    action_dim=2,
    action_chunk=4,
    instruction="reach the goal",
)
SIDES = ("shared", "shared-plain", "copy")


def _config(tenant: str, out: Path) -> TenantConfig:
    return TenantConfig(
        tenant_id=tenant,
        schema_=SCHEMA,
        head=OFTHeadConfig(hidden_dim=64, num_blocks=1),
        output_dir=out,
    )


async def _side(
    side: str,
    model_dir: Path,
    out: Path,
    *,
    clients: int,
    batch: int,
    duration_s: float,
) -> dict[str, Any]:
    base = ResidentBaseModel.from_pretrained(str(model_dir))
    copy = side == "copy"
    inference_base = ResidentBaseModel.from_pretrained(str(model_dir)) if copy else base
    backbone_lock(base).prioritize = side != "shared-plain"
    metrics = MetricsService()
    training = TrainingModelService(base, TrainingQueue(), output_dir=out / side)
    inference = InferenceModelService(
        inference_base, EnvironmentService(), TrainingQueue(), metrics=metrics
    )
    await training.add_tenant(_config("trainer", out))
    names = [f"client{i}" for i in range(clients)]
    for name in names:
        await inference.add_tenant(_config(name, out))
    train_obs = ObservationBatch.synthetic(SCHEMA, batch, seed=0, with_actions=True)
    obs = [ObservationBatch.synthetic(SCHEMA, 1, seed=i + 1, with_actions=False) for i in range(8)]
    latencies: list[float] = []
    steps = 0
    async with inference:
        for name in names:  # warm-up, untimed
            await inference.predict(obs[0], name)
        await training.train_batch("trainer", TrainBatch(observations=train_obs))
        before = metrics.stages.snapshot()
        start = time.perf_counter()
        deadline = start + duration_s

        async def client(name: str, k: int) -> None:
            i = k
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                await inference.predict(obs[i % len(obs)], name)
                latencies.append(time.perf_counter() - t0)
                i += 1

        async def trainer() -> None:
            nonlocal steps
            while time.perf_counter() < deadline:
                await training.train_batch("trainer", TrainBatch(observations=train_obs))
                steps += 1

        await asyncio.gather(trainer(), *(client(n, k) for k, n in enumerate(names)))
        elapsed = time.perf_counter() - start
        after = metrics.stages.snapshot()
    lock_s = after.get("lock_wait", (0.0, 0))[0] - before.get("lock_wait", (0.0, 0))[0]
    batches = after.get("lock_wait", (0.0, 0))[1] - before.get("lock_wait", (0.0, 0))[1]
    lat = np.asarray(latencies, dtype=np.float64)
    backbones = {id(base): base, id(inference_base): inference_base}
    return {
        "side": side,
        "predicts": int(lat.size),
        "predict_per_s": lat.size / elapsed if elapsed > 0 else 0.0,
        "p50_ms": float(np.percentile(lat, 50) * 1e3) if lat.size else float("nan"),
        "p99_ms": float(np.percentile(lat, 99) * 1e3) if lat.size else float("nan"),
        "lock_wait_ms_per_batch": lock_s / batches * 1e3 if batches else float("nan"),
        "train_steps": steps,
        "train_steps_per_s": steps / elapsed if elapsed > 0 else 0.0,
        "backbone_mb": sum(b.parameter_bytes() for b in backbones.values()) / 2**20,
        "elapsed_s": elapsed,
    }


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b > 0 else float("nan")


def run_backbone_lock_bench(
    *,
    size: str = "tiny",
    clients: int = 4,
    batch: int = 8,
    duration_s: float = 10.0,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run both sides one after the other; the figures and ratios (JSON-ready).

    Args:
        size: ``tiny`` or ``small``.
        clients: Closed-loop predict clients (one tenant each).
        batch: Rows of each SFT step.
        duration_s: Timed mixture per side.
        threads: torch intra-op threads (None: torch's default).
    """
    say = progress or (lambda _line: None)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(size, clients, batch, duration_s, say)
    finally:
        torch.set_num_threads(before)


def _run(
    size: str, clients: int, batch: int, duration_s: float, say: Callable[[str], None]
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="joynexus-bench-lock-") as tmp, quiet_transformers():
        root = Path(tmp)
        say(f"building the {size} qwen2_5_vl model")
        model_dir = make_tiny("qwen2_5_vl", root / "model", size=cast(TinySize, size), seed=0)
        sides = {}
        for side in SIDES:
            say(f"{side}: 1 training tenant + {clients} predict clients for {duration_s:g} s")
            sides[side] = asyncio.run(
                _side(side, model_dir, root, clients=clients, batch=batch, duration_s=duration_s)
            )
    shared, plain, copy = sides["shared"], sides["shared-plain"], sides["copy"]
    return {
        "config": {
            "size": size,
            "arch": "qwen2_5_vl",
            "clients": clients,
            "train_batch": batch,
            "duration_s": duration_s,
            "torch_threads": torch.get_num_threads(),
        },
        **sides,
        "predict_throughput_ratio": _ratio(copy["predict_per_s"], shared["predict_per_s"]),
        "p99_ratio": _ratio(copy["p99_ms"], shared["p99_ms"]),
        "train_throughput_ratio": _ratio(copy["train_steps_per_s"], shared["train_steps_per_s"]),
        "memory_ratio": _ratio(copy["backbone_mb"], shared["backbone_mb"]),
        "priority": {
            "p99_ratio": _ratio(shared["p99_ms"], plain["p99_ms"]),
            "lock_wait_ratio": _ratio(
                shared["lock_wait_ms_per_batch"], plain["lock_wait_ms_per_batch"]
            ),
            "predict_throughput_ratio": _ratio(shared["predict_per_s"], plain["predict_per_s"]),
            "train_throughput_ratio": _ratio(
                shared["train_steps_per_s"], plain["train_steps_per_s"]
            ),
        },
    }


def print_report(result: dict[str, Any], console: Console) -> None:
    cfg = result["config"]
    table = Table(
        "backbone",
        "predicts/s",
        "p50 ms",
        "p99 ms",
        "lock wait ms/batch",
        "train steps/s",
        "backbone MB",
        title=(
            f"training + inference on one process: {cfg['clients']} predict clients + 1 "
            f"SFT tenant (batch {cfg['train_batch']}), {cfg['size']} model, "
            f"{cfg['duration_s']:g} s per side"
        ),
    )
    for side in SIDES:
        r = result[side]
        table.add_row(
            side,
            f"{r['predict_per_s']:.1f}",
            f"{r['p50_ms']:.1f}",
            f"{r['p99_ms']:.1f}",
            f"{r['lock_wait_ms_per_batch']:.1f}",
            f"{r['train_steps_per_s']:.2f}",
            f"{r['backbone_mb']:.1f}",
        )
    console.print(table)
    console.print(
        f"copy / shared: predict throughput {result['predict_throughput_ratio']:.2f}x, "
        f"p99 {result['p99_ratio']:.2f}x, train throughput "
        f"{result['train_throughput_ratio']:.2f}x, backbone memory "
        f"{result['memory_ratio']:.2f}x"
    )
    pr = result["priority"]
    console.print(
        f"shared / shared-plain (predicts first, steps yield between phases): p99 "
        f"{pr['p99_ratio']:.2f}x, lock wait {pr['lock_wait_ratio']:.2f}x, predict "
        f"throughput {pr['predict_throughput_ratio']:.2f}x, train throughput "
        f"{pr['train_throughput_ratio']:.2f}x"
    )
