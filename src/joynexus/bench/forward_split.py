"""``joynexus bench forward-split``: a CPU forward serial, split, by the size rule and by
measurement, on a quiet machine and beside busy processes.

A serving batch's backbone forward (one row per tenant, a Qwen-VL backbone built offline
as the serving bench's) runs four ways, interleaved round after round so the machine's
drift touches each alike: ``serial`` (the calling thread alone), ``split`` (torch's
intra-op threads), ``size`` (the size rule, :data:`~joynexus.models.backbone.
SERIAL_FORWARD_MACS`) and ``measured`` (:class:`~joynexus.utils.split_choice.
SplitChooser`, the default, whose measurements carry over from round to round as in a
server). Each load is a number of processes of the bench's own that spin on the CPU
beside it (0: none; the machine's own load is recorded, not controlled). The report
gives each way's median per batch and ``measured`` against ``size`` and against the
better fixed way of that load.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from joynexus.bench.group_batching import tenant_groups
from joynexus.models.backbone import SERIAL_FORWARD_MACS, ForwardSplit, ResidentBaseModel
from joynexus.models.tiny import make_tiny
from joynexus.utils.busy import busy_processes
from joynexus.utils.intra_op import serial_intra_op
from joynexus.utils.split_choice import SplitChooser

WAYS = ("serial", "split", "size", "measured")
#: The ways the backbone itself chooses (the others are fixed here).
_CHOSEN: dict[str, ForwardSplit] = {"size": "size", "measured": "measured"}


def run_forward_split_bench(
    *,
    size: str = "small",
    rows: Sequence[int] = (1, 4, 16, 33),
    busy: Sequence[int] = (0, 1),
    rounds: int = 12,
    threads: int = 2,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Median ms per forward of each way, rows and load (JSON-ready).

    Args:
        size: The Qwen-VL backbone's size (``tiny`` or ``small``).
        rows: Rows per batch (one per tenant).
        busy: Numbers of spinning processes beside the bench.
        rounds: Timed rounds per rows and load (after one untimed round).
        threads: torch's intra-op threads (what ``split`` uses).

    Raises:
        ValueError: no rows, a row count or a round count below 1, or a negative load.
    """
    if not rows or min(rows) < 1 or rounds < 1 or (busy and min(busy) < 0):
        raise ValueError(
            f"rows ≥ 1, rounds ≥ 1 and busy ≥ 0 expected; got rows={list(rows)}, "
            f"rounds={rounds}, busy={list(busy)}"
        )
    say = progress or (lambda _line: None)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    cells: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="joynexus-bench-split-") as tmp:
            say(f"building the {size} Qwen-VL backbone")
            base = ResidentBaseModel.from_pretrained(
                str(make_tiny("qwen2_5_vl", Path(tmp) / "model", size=size))
            )
            for load in busy:
                with busy_processes(load):
                    for n in rows:
                        say(f"{n} rows beside {load} busy process(es): {rounds} rounds")
                        cells.append(_cell(base, n, load, rounds))
    finally:
        torch.set_num_threads(before)
    return {
        "size": size,
        "threads": threads,
        "rounds": rounds,
        "serial_forward_macs": SERIAL_FORWARD_MACS,
        "cells": cells,
    }


def _cell(base: ResidentBaseModel, rows: int, load: int, rounds: int) -> dict[str, Any]:
    feature = base.canonicalize(tenant_groups(base, rows, 1), validated=False)
    chooser = SplitChooser()
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    chosen: list[bool] = []
    load_start = os.getloadavg()[0]

    def forward(way: str) -> float:
        kind = _CHOSEN.get(way)
        if kind is not None:
            base.use_forward_split(kind, chooser)
            split = base.forward_splits(feature)
        else:
            split = way == "split"
        with serial_intra_op(not split):
            start = time.perf_counter()
            base.encode(feature)
            elapsed = time.perf_counter() - start
        if way == "measured":
            base.forward_took(feature, split, elapsed)
            chosen.append(split)
        return elapsed

    try:
        for i in range(rounds + 1):
            for way in WAYS:
                elapsed = forward(way)
                if i:  # the first round warms the allocator
                    times[way].append(elapsed)
    finally:
        base.use_forward_split("measured")
    median = {way: statistics.median(t) * 1e3 for way, t in times.items()}
    best = min(median["serial"], median["split"])
    return {
        "rows": rows,
        "busy": load,
        "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "median_ms": median,
        "measured_over_size": median["measured"] / median["size"],
        "measured_over_best": median["measured"] / best,
        "measured_split_share": sum(chosen) / len(chosen),
    }


def print_report(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"forward of a {result['size']} Qwen-VL batch, ms (median of {result['rounds']})"
    )
    for col in ("busy", "rows", *WAYS, "measured ÷ size", "measured ÷ best", "split share"):
        table.add_column(col, justify="right")
    for c in result["cells"]:
        m = c["median_ms"]
        table.add_row(
            str(c["busy"]),
            str(c["rows"]),
            *(f"{m[w]:.1f}" for w in WAYS),
            f"{c['measured_over_size']:.2f}",
            f"{c['measured_over_best']:.2f}",
            f"{c['measured_split_share']:.2f}",
        )
    console.print(table)
