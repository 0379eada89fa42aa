"""How loaded the machine was during a phase: load average samples and per-core busy time.

The demo's phases run on a machine other jobs may share. Each phase records
(:class:`LoadProbe`, started when its loops start, stopped when its run ends):

* the 1-minute load average (``os.getloadavg``) sampled every few seconds: min / mean /
  max;
* each core's busy seconds over the phase from ``/proc/stat`` (user + nice + system +
  irq + softirq + steal), so the report can say how much of the device's core went to
  something other than the device work (its own CPU seconds are measured apart,
  :mod:`joynexus.utils.device_clock`).

* the CPU seconds and run-queue wait of this process's own threads over the phase
  (:func:`~joynexus.utils.device_clock.process_clock`): less the device spans' share,
  what its host threads (event loop, workers) ran and waited for a core. The
  simulators' wait is measured per call by the workers themselves.

Each part is left empty where the platform lacks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from joynexus.utils.device_clock import process_clock

__all__ = ["LoadProbe", "MachineLoad", "core_busy_seconds"]

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal


def core_busy_seconds(stat_text: str | None = None) -> dict[int, float]:
    """Busy seconds of every core since boot, from ``/proc/stat`` (empty where absent).

    Args:
        stat_text: The file's text (default: read it now).
    """
    if stat_text is None:
        try:
            with open("/proc/stat") as f:
                stat_text = f.read()
        except OSError:
            return {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, float] = {}
    for line in stat_text.splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        nums = [int(v) for v in values]
        out[int(name[3:])] = sum(nums[i] for i in _BUSY_FIELDS if i < len(nums)) / tick
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _load1() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@dataclass
class MachineLoad:
    """The machine's load over one phase.

    Attributes:
        start / end: Wall-clock times (``time.time()``) of the probe's start and stop.
        period_s: Seconds from the probe's start to its stop.
        load1: The 1-minute load average samples.
        core_busy_s: Busy seconds of each core over the period.
        process_cpu_s / process_wait_s: CPU seconds and run-queue wait of this
            process's threads over the period (None: not measurable here).
    """

    start: float = 0.0
    end: float = 0.0
    period_s: float = 0.0
    load1: list[float] = field(default_factory=list)
    core_busy_s: dict[int, float] = field(default_factory=dict)
    process_cpu_s: float | None = None
    process_wait_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        xs = self.load1
        return {
            "period_s": round(self.period_s, 2),
            "load_average_1min": {
                "min": round(min(xs), 2) if xs else None,
                "mean": round(sum(xs) / len(xs), 2) if xs else None,
                "max": round(max(xs), 2) if xs else None,
                "samples": len(xs),
            },
            "core_busy_s": {str(c): round(s, 2) for c, s in sorted(self.core_busy_s.items())},
            "process": {
                "cpu_s": _round(self.process_cpu_s),
                "run_queue_wait_s": _round(self.process_wait_s),
            },
        }


class LoadProbe:
    """Samples the load average every ``interval_s`` on the running event loop and
    takes ``/proc/stat`` at start and stop."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self._t0 = 0.0
        self._start = 0.0
        self._cores0: dict[int, float] = {}
        self._clock0: tuple[float, float] | None = None
        self._samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def _sample(self) -> None:
        x = _load1()
        if x is not None:
            self._samples.append(x)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self._sample()

    def start(self) -> None:
        self._t0, self._start = time.monotonic(), time.time()
        self._cores0 = core_busy_seconds()
        self._clock0 = process_clock()
        self._sample()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> MachineLoad:
        """Stop sampling; what the probe saw (empty if it never started)."""
        if self._task is None:
            return MachineLoad()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self._sample()
        cores1 = core_busy_seconds()
        clock0, clock1 = self._clock0, process_clock()
        spent = (
            None
            if clock0 is None or clock1 is None
            else (clock1[0] - clock0[0], clock1[1] - clock0[1])
        )
        return MachineLoad(
            start=self._start,
            end=time.time(),
            period_s=time.monotonic() - self._t0,
            load1=list(self._samples),
            core_busy_s={c: cores1[c] - self._cores0[c] for c in cores1 if c in self._cores0},
            process_cpu_s=None if spent is None else spent[0],
            process_wait_s=None if spent is None else max(spent[1], 0.0),
        )
