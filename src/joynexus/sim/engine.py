"""A small, deterministic discrete-event engine driven by Python generators.

A *process* is a generator that yields commands to the engine:

* :class:`Timeout` ``(dt)`` — resume ``dt`` simulated seconds later;
* :class:`WaitSignal` ``(signal, timeout=None)`` — resume when ``signal`` fires (the
  generator receives ``True``) or after ``timeout`` seconds (it receives ``False``).

Events are ordered by ``(time, sequence number)``: two events due at the same instant
run in the order they were scheduled, so a run is a pure function of its inputs (no
wall clock, no hash ordering, no threads).

:class:`Signal` is a broadcast pulse: ``fire()`` wakes every process waiting at that
moment, in the order they started waiting, and is forgotten afterwards. :class:`Event`
is latched: once fired, waiting on it returns at once (a one-shot reply, such as an
inference result).

:class:`SimClock` exposes the engine's time through the :class:`~joynexus.utils.clock.Clock`
protocol, so real components (the Training Scheduler's leases) run on simulated time.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from joynexus.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class Timeout:
    """Resume the yielding process ``dt`` simulated seconds from now."""

    dt: float


@dataclass(frozen=True, slots=True)
class WaitSignal:
    """Resume when ``signal`` fires (sends True) or after ``timeout`` s (sends False)."""

    signal: Signal
    timeout: float | None = None


Command = Timeout | WaitSignal
ProcessGen = Generator[Command, Any, None]


class Process:
    """A running generator plus the bookkeeping the engine needs to resume it."""

    __slots__ = ("_gen", "_token", "done", "finished_at", "name")

    def __init__(self, name: str, gen: ProcessGen) -> None:
        self.name = name
        self._gen = gen
        # Each wait gets a fresh token; a wake-up carrying an older token is ignored
        # (it lost the race between a signal and a timeout).
        self._token = 0
        self.done = False
        self.finished_at: float | None = None


class Signal:
    """A broadcast pulse: :meth:`fire` wakes every current waiter, then forgets.

    Args:
        engine: The engine whose processes wait on this signal.
        name: For debugging.
    """

    def __init__(self, engine: Engine, name: str = "") -> None:
        self._engine = engine
        self.name = name
        self._waiters: list[tuple[Process, int]] = []
        self.fire_count = 0

    def fire(self) -> None:
        """Wake every process waiting now, in the order it began to wait."""
        self.fire_count += 1
        waiters, self._waiters = self._waiters, []
        for proc, token in waiters:
            self._engine._schedule(0.0, proc, token, True)

    @property
    def triggered(self) -> bool:
        """A pulse is never "already fired" for a new waiter."""
        return False

    def _add(self, proc: Process, token: int) -> None:
        self._waiters.append((proc, token))


class Event(Signal):
    """A latched signal: after :meth:`fire`, every wait on it returns at once."""

    def __init__(self, engine: Engine, name: str = "") -> None:
        super().__init__(engine, name)
        self._fired = False

    @property
    def triggered(self) -> bool:
        return self._fired

    def fire(self) -> None:
        self._fired = True
        super().fire()


class SimClock:
    """The engine's time as a :class:`~joynexus.utils.clock.Clock`.

    ``now()`` is simulated seconds since the start of the run; ``wall()`` adds a fixed
    epoch offset so timestamps look like Unix times. ``sleep`` is not available:
    simulated processes yield :class:`Timeout` instead of awaiting.
    """

    def __init__(self, engine: Engine, epoch: float = 1_700_000_000.0) -> None:
        self._engine = engine
        self.epoch = epoch

    def now(self) -> float:
        return self._engine.now

    def wall(self) -> float:
        return self.epoch + self._engine.now

    async def sleep(self, seconds: float) -> None:
        raise NotImplementedError(
            "SimClock cannot sleep: a simulated process yields Timeout(dt) to the engine"
        )


class Engine:
    """Runs processes in simulated time; see the module docstring for the commands."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Process, int, Any]] = []
        self._seq = itertools.count()
        self._processes: list[Process] = []
        self.events_processed = 0
        self.clock = SimClock(self)

    def signal(self, name: str = "") -> Signal:
        """A new broadcast :class:`Signal` on this engine."""
        return Signal(self, name)

    def event(self, name: str = "") -> Event:
        """A new latched :class:`Event` on this engine."""
        return Event(self, name)

    def spawn(self, gen: ProcessGen, name: str = "") -> Process:
        """Start ``gen`` at the current time (after already-scheduled same-time events)."""
        proc = Process(name or f"process-{len(self._processes)}", gen)
        self._processes.append(proc)
        self._schedule(0.0, proc, proc._token, None)
        return proc

    def _schedule(self, dt: float, proc: Process, token: int, value: Any) -> None:
        heapq.heappush(self._heap, (self.now + dt, next(self._seq), proc, token, value))

    def run(self, until: float | None = None, stop: Callable[[], bool] | None = None) -> float:
        """Process events in order until none remain, time would pass ``until``, or
        ``stop()`` returns True (checked after every event). Returns the current time.

        When ``until`` is given and events remain beyond it, time is advanced to
        ``until`` exactly.
        """
        heap = self._heap
        while heap:
            t = heap[0][0]
            if until is not None and t > until:
                self.now = max(self.now, until)
                return self.now
            _, _, proc, token, value = heapq.heappop(heap)
            if proc.done or token != proc._token:
                continue
            self.now = t
            self.events_processed += 1
            self._step(proc, value)
            if stop is not None and stop():
                return self.now
        if until is not None:
            self.now = max(self.now, until)
        return self.now

    def _step(self, proc: Process, value: Any) -> None:
        try:
            cmd = proc._gen.send(value)
        except StopIteration:
            proc.done = True
            proc.finished_at = self.now
            return
        proc._token += 1
        token = proc._token
        if isinstance(cmd, Timeout):
            if cmd.dt < 0:
                raise InvalidRequestError(
                    f"process {proc.name!r} yielded Timeout({cmd.dt}); dt must be >= 0"
                )
            self._schedule(cmd.dt, proc, token, None)
        elif isinstance(cmd, WaitSignal):
            if cmd.signal.triggered:
                self._schedule(0.0, proc, token, True)
                return
            cmd.signal._add(proc, token)
            if cmd.timeout is not None:
                self._schedule(max(0.0, cmd.timeout), proc, token, False)
        else:
            raise InvalidRequestError(
                f"process {proc.name!r} yielded {cmd!r}; expected Timeout or WaitSignal"
            )
