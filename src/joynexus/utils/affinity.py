"""Core pinning: the model services ("the device") on one set of cores, simulators on another.

On one machine without an accelerator the model services and the simulator worker
processes otherwise share every core, so an isolated tenant's "device" never idles
while its simulator steps — it just loses cores to it — and multiplexing has no idle
device time to recover. Running the device work (training steps, inference batches,
with torch's intra-op thread count matched to the cores) on one set and every
simulator worker on the other reproduces a GPU that waits on CPU simulators.

``--device-cores`` takes ``auto`` (on a machine with at least 2 usable cores, the first
half for the device, the rest for the workers), ``none`` (no pinning), or a core list
such as ``0``, ``0-1`` or ``0,2-3`` (the device's cores; the workers get every other
usable core). :func:`plan_cores` turns the option into a :class:`CorePlan`;
:func:`pin_device` applies it to this process; simulator workers pin
themselves with :func:`pin_this_process` at start (the Environment Service passes the
worker cores in its config). Where ``os.sched_setaffinity`` does not exist
(non-Linux) the plan says so and nothing is pinned.

Within the pinned process, device work runs on the device's cores only: a thread doing
it — a training step, an inference batch, a slot snapshot — moves onto them for exactly
that work (:func:`on_device`), and torch's intra-op worker threads (not Python threads)
stay there. The process's Python threads (the event loop, executor and metrics threads:
the host) keep every core the process had, so the kernel runs host work wherever a core
is free: on the device's core while it waits between steps, beside the simulators while
a step runs. Pinned to the device's core instead, the host's own Python (committing,
checkpoint writes, rollout bookkeeping, metrics) always took its time from the steps;
pinned to the simulators' cores, it waited behind the simulators between two steps
(RESULTS §1.2 measures both).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from joynexus.errors import InvalidRequestError
from joynexus.utils.device_clock import device_span

__all__ = [
    "CorePlan",
    "available_cores",
    "can_pin",
    "current_affinity",
    "on_device",
    "parse_core_list",
    "pin_device",
    "pin_this_process",
    "pinned_device_cores",
    "plan_cores",
]


def can_pin() -> bool:
    """Whether this platform can pin processes to cores (``os.sched_setaffinity``)."""
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def available_cores() -> frozenset[int]:
    """The cores this process may run on (every core where affinity is unknown)."""
    if can_pin():
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def current_affinity(pid: int = 0) -> list[int] | None:
    """The sorted cores ``pid`` (0: this process) may run on; None where unknown."""
    if not can_pin():
        return None
    return sorted(os.sched_getaffinity(pid))


def parse_core_list(text: str) -> frozenset[int]:
    """``"0"``, ``"0-1"``, ``"0,2-3"`` → the set of core numbers.

    Raises:
        InvalidRequestError: Not a comma-separated list of cores and ``A-B`` ranges.
    """
    cores: set[int] = set()
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise InvalidRequestError(
            f"--device-cores: {text!r} is not a core list (examples: 0, 0-1, 0,2-3, auto, none)",
            field="device_cores",
        )
    for part in parts:
        lo_s, sep, hi_s = part.partition("-")
        if not lo_s.strip().isdigit() or (sep and not hi_s.strip().isdigit()):
            raise InvalidRequestError(
                f"--device-cores: {part!r} is not a core number or an A-B range "
                "(examples: 0, 0-1, 0,2-3, auto, none)",
                field="device_cores",
            )
        lo = int(lo_s)
        hi = int(hi_s) if sep else lo
        if hi < lo:
            raise InvalidRequestError(
                f"--device-cores: range {part!r} runs backwards", field="device_cores"
            )
        cores.update(range(lo, hi + 1))
    return frozenset(cores)


@dataclass(frozen=True)
class CorePlan:
    """Which cores the device (this process) and the simulator workers get.

    Attributes:
        mode: The option as given (``auto``, ``none`` or a core list).
        device: Cores of the model services (None: not pinned).
        workers: Cores of the simulator worker processes (None: not pinned).
        note: Why nothing is pinned (``none``, one core, no ``sched_setaffinity``), or
            empty.
    """

    mode: str
    device: frozenset[int] | None = None
    workers: frozenset[int] | None = None
    note: str = ""

    @property
    def pinned(self) -> bool:
        """Whether the plan pins anything."""
        return self.device is not None

    @property
    def worker_cores(self) -> list[int] | None:
        """The workers' cores as a sorted list (what the Environment Service takes)."""
        return None if self.workers is None else sorted(self.workers)

    def describe(self) -> str:
        """One line for the console."""
        if self.device is None or self.workers is None:
            return f"core pinning: off ({self.note or self.mode})"
        return (
            f"core pinning: model services (the device) on cores {_span(self.device)}, "
            f"simulator workers on cores {_span(self.workers)}"
        )

    def to_json(self) -> dict[str, Any]:
        """What a report records (``device_cores`` / ``worker_cores``: None when off)."""
        return {
            "mode": self.mode,
            "pinned": self.pinned,
            "device_cores": None if self.device is None else sorted(self.device),
            "worker_cores": self.worker_cores,
            "note": self.note,
        }


def _span(cores: Iterable[int]) -> str:
    """``{0, 1, 2, 5}`` → ``"0-2,5"``."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cores):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def plan_cores(option: str, available: Iterable[int] | None = None) -> CorePlan:
    """Turn a ``--device-cores`` value into a plan (nothing is applied yet).

    Args:
        option: ``auto``, ``none`` or a core list (see the module docstring).
        available: The usable cores (default: this process's affinity).

    Raises:
        InvalidRequestError: A malformed list, a core this process may not use, or a
            list that leaves no core for the simulator workers.
    """
    mode = option.strip().lower()
    if mode in ("none", "off"):
        return CorePlan(mode="none", note="disabled with --device-cores none")
    cores = frozenset(available) if available is not None else available_cores()
    if mode != "auto":
        device = parse_core_list(mode)  # checked even where pinning is unavailable
        if not can_pin():
            return CorePlan(
                mode=mode, note="this platform has no os.sched_setaffinity; running unpinned"
            )
        outside = device - cores
        if outside:
            raise InvalidRequestError(
                f"--device-cores: core(s) {_span(outside)} are not usable here "
                f"(usable: {_span(cores)})",
                field="device_cores",
            )
        workers = cores - device
        if not workers:
            raise InvalidRequestError(
                f"--device-cores {mode} leaves no core for the simulator workers "
                f"(usable: {_span(cores)}); give the device fewer cores, or use none",
                field="device_cores",
            )
        return CorePlan(mode=mode, device=device, workers=workers)
    if not can_pin():
        return CorePlan(
            mode="auto", note="this platform has no os.sched_setaffinity; running unpinned"
        )
    if len(cores) < 2:
        return CorePlan(mode="auto", note=f"{len(cores)} usable core: nothing to split")
    ordered = sorted(cores)
    half = len(ordered) // 2
    return CorePlan(
        mode="auto", device=frozenset(ordered[:half]), workers=frozenset(ordered[half:])
    )


def _threads() -> list[int]:
    """This process's thread ids (Linux: /proc/self/task), else just ``[0]``."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def pin_this_process(cores: Iterable[int]) -> None:
    """Pin every thread of this process to ``cores`` (threads started later inherit).

    ``os.sched_setaffinity(0, ...)`` pins the calling thread only on Linux; the threads
    that already exist (torch's intra-op pool, executor threads) are pinned one by one.
    A no-op where the platform cannot pin.
    """
    if not can_pin():
        return
    os.sched_setaffinity(0, set(cores))
    _pin_threads(_threads(), cores)


def _pin_threads(thread_ids: Iterable[int], cores: Iterable[int]) -> None:
    """Pin each thread to ``cores``; one that ended meanwhile is skipped."""
    wanted = set(cores)
    for tid in thread_ids:
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.sched_setaffinity(tid, wanted)


#: The device cores of the pinning in force (:func:`pin_device`); None: not pinned.
_device_cores: frozenset[int] | None = None


def _pin_python_threads(cores: Iterable[int]) -> None:
    """Pin this process's Python threads (not torch's intra-op workers) to ``cores``."""
    _pin_threads((t.native_id for t in threading.enumerate() if t.native_id is not None), cores)


def pinned_device_cores() -> frozenset[int] | None:
    """The device's cores of the pinning in force (:func:`pin_device`); None: none."""
    return _device_cores


@contextlib.contextmanager
def on_device() -> Iterator[None]:
    """Run the enclosed device work on the device's cores (see the module docstring).

    The calling thread moves onto the device cores of the pinning in force and back to
    the cores it had on exit; threads torch starts meanwhile inherit the device cores.
    Without a pinning (or where the platform cannot pin) it changes nothing. Either way
    the work's own CPU time and run-queue wait go to any open
    :class:`~joynexus.utils.device_clock.SpanRecorder` (the demo's device accounting).
    """
    with device_span(), _on_device_cores():
        yield


@contextlib.contextmanager
def _on_device_cores() -> Iterator[None]:
    device = _device_cores
    if device is None or not can_pin():
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, device)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, before)


@contextlib.contextmanager
def pin_device(plan: CorePlan) -> Iterator[CorePlan]:
    """Pin this process (the model services) to the plan's cores, with torch's
    intra-op threads set to as many as the device has; restored on exit. Yields the plan.

    torch's intra-op workers get the device cores; every Python thread (the host: event
    loop, executors, metrics) keeps this process's cores, and device work moves onto the
    device cores while it runs (:func:`on_device`). A plan that pins nothing changes
    nothing.
    """
    global _device_cores
    if plan.device is None or plan.workers is None or not can_pin():
        yield plan
        return
    import torch

    previous_cores = set(os.sched_getaffinity(0))
    previous_threads = torch.get_num_threads()
    try:
        pin_this_process(plan.device)
        _pin_python_threads(previous_cores)
    except OSError as exc:
        pin_this_process(previous_cores)
        raise InvalidRequestError(
            f"cannot pin the model services to cores {_span(plan.device)}: {exc}",
            field="device_cores",
        ) from None
    torch.set_num_threads(len(plan.device))
    previous_device, _device_cores = _device_cores, plan.device
    try:
        yield plan
    finally:
        _device_cores = previous_device
        torch.set_num_threads(previous_threads)
        pin_this_process(previous_cores)
