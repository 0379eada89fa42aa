"""``joynexus bench idle-wake``: what an idle pause costs the next request's own work.

A lone client's request reaches processes that sat idle while the previous answer
travelled: the front process for the whole forward, the model process for the client's
round trip and the Inference Queue's wait. On a virtual machine an idle core can be
handed to other work, and the next request likely finds its caches cold: the same code
takes longer. The service-overhead figure of ``joynexus bench serving`` (a lone
request's stages) holds that cost.

This bench runs the two largest stages of that figure in one process: the front's
decoding of one predict body (:func:`~joynexus.server.front.app.decode_predict`) and the model
process's canonicalization of the decoded observation (the tensor path of a Qwen-VL
backbone built offline, as the serving bench's). Each is timed right after the
previous call (``0`` ms: back to back) and after each idle pause, the pauses taken in a
shuffled order every round; the report gives the medians and their ratio to back to
back. The difference is the machine's, not the code's: the code is the same.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from joynexus.bench.serving import IMAGE_SIZE, predict_body
from joynexus.envs.base import EnvSpec
from joynexus.envs.reach2d import reach2d_schema
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.tiny import make_tiny
from joynexus.server.config import ServerConfig
from joynexus.server.front.app import decode_predict
from joynexus.server.routes.models import PredictIn
from joynexus.wire import MSGPACK_MEDIA_TYPE

__all__ = ["print_report", "run_idle_wake_bench"]

DEFAULT_PAUSES_MS = (0.0, 1.0, 10.0, 50.0)
_CONFIG = ServerConfig()  # the server's default bounds


def _decode(raw: bytes) -> PredictIn:
    """What a front process does with a predict body before handing it on."""
    return decode_predict(raw, MSGPACK_MEDIA_TYPE, _CONFIG)


def run_idle_wake_bench(
    *,
    size: str = "small",
    pauses_ms: Sequence[float] = DEFAULT_PAUSES_MS,
    repeats: int = 40,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Median ms of each stage after each idle pause (JSON-ready).

    Args:
        size: The Qwen-VL backbone's size (``tiny`` or ``small``), as the serving bench's.
        pauses_ms: Idle pauses before a timed call (back to back, ``0``, is always
            timed too: the ratios' reference).
        repeats: Timed calls per stage and pause (after one untimed round).
        seed: Seeds the bodies and the pause order.

    Raises:
        ValueError: a negative pause, or fewer than one repeat.
    """
    if any(p < 0 for p in pauses_ms):
        raise ValueError(f"pauses_ms: expected pauses ≥ 0, got {list(pauses_ms)}")
    if repeats < 1:
        raise ValueError(f"repeats: expected at least 1, got {repeats}")
    say = progress or (lambda _line: None)
    pauses = sorted({0.0, *(float(p) for p in pauses_ms)})  # back to back: the reference
    schema = reach2d_schema(EnvSpec(kind="reach2d", image_size=IMAGE_SIZE))
    bodies = [predict_body(seed + i) for i in range(repeats + 1)]
    with tempfile.TemporaryDirectory(prefix="joynexus-bench-idle-") as tmp:
        say(f"building the {size} Qwen-VL backbone")
        base = ResidentBaseModel.from_pretrained(
            str(make_tiny("qwen2_5_vl", Path(tmp) / "model", size=size))
        )

        batches = []
        for raw in bodies:
            obs = _decode(raw).observations
            batch = ObservationBatch(
                cameras=dict(obs.cameras), state=obs.state, instructions=list(obs.instructions)
            )
            batch.validate(schema)  # as at admission: canonicalization trusts it
            batches.append(batch)

        def canonicalize(i: int) -> float:
            start = time.perf_counter()
            base.canonicalize([("t0", schema, batches[i])], validated=True)
            return time.perf_counter() - start

        def decode(i: int) -> float:
            start = time.perf_counter()
            _decode(bodies[i])
            return time.perf_counter() - start

        stages: dict[str, Callable[[int], float]] = {
            "decode": decode,
            "canonicalize": canonicalize,
        }
        times: dict[str, dict[float, list[float]]] = {s: {p: [] for p in pauses} for s in stages}
        order = [(stage, p) for stage in stages for p in pauses]
        rng = random.Random(seed)
        say(f"timing {len(order)} stage × pause pairs, {repeats} rounds")
        for i in range(len(bodies)):
            rng.shuffle(order)
            for stage, pause in order:
                run = stages[stage]
                run(i)  # the timed call's back-to-back predecessor
                if pause > 0:
                    time.sleep(pause / 1e3)
                elapsed = run(i)
                if i:  # the first round warms the prompt cache and the allocator
                    times[stage][pause].append(elapsed)
    medians = {
        stage: {_key(p): statistics.median(s) * 1e3 for p, s in per_pause.items()}
        for stage, per_pause in times.items()
    }
    return {
        "size": size,
        "repeats": repeats,
        "pauses_ms": pauses,
        "median_ms": medians,
        "ratio_to_back_to_back": {
            stage: {k: v / m["0"] for k, v in m.items()} for stage, m in medians.items()
        },
    }


def _key(pause: float) -> str:
    return f"{pause:g}"


def print_report(result: dict[str, Any], console: Console) -> None:
    pauses = [_key(p) for p in result["pauses_ms"]]
    table = Table(
        "stage",
        *[f"after {p} ms" for p in pauses],
        title=(
            f"one request's own work after an idle pause ({result['size']} Qwen-VL, "
            f"median of {result['repeats']}, ms; × back to back)"
        ),
    )
    for stage, medians in result["median_ms"].items():
        ratios = result["ratio_to_back_to_back"][stage]
        table.add_row(stage, *[f"{medians[p]:.3f} ({ratios[p]:.1f}×)" for p in pauses])
    console.print(table)
