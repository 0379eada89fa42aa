from __future__ import annotations

import asyncio

import pytest

from joynexus.errors import InvalidRequestError
from joynexus.sim.engine import Engine, ProcessGen, Timeout, WaitSignal


def test_timeouts_run_in_time_order_and_ties_in_schedule_order() -> None:
    eng = Engine()
    log: list[tuple[float, str]] = []

    def proc(name: str, delays: list[float]) -> ProcessGen:
        for d in delays:
            yield Timeout(d)
            log.append((eng.now, name))

    eng.spawn(proc("a", [2.0, 1.0]), "a")
    eng.spawn(proc("b", [1.0, 2.0]), "b")
    eng.spawn(proc("c", [3.0]), "c")
    end = eng.run()
    # a, b and c all wake at t=3: the tie resolves in the order the wake-ups were
    # scheduled (c at t=0, b at t=1, a at t=2).
    assert log == [(1.0, "b"), (2.0, "a"), (3.0, "c"), (3.0, "b"), (3.0, "a")]
    assert end == 3.0


def test_signal_wakes_current_waiters_in_wait_order_and_then_forgets() -> None:
    eng = Engine()
    sig = eng.signal("s")
    woke: list[tuple[str, float, bool]] = []

    def waiter(name: str, start: float) -> ProcessGen:
        yield Timeout(start)
        got = yield WaitSignal(sig)
        woke.append((name, eng.now, got))

    def firer() -> ProcessGen:
        yield Timeout(5.0)
        sig.fire()

    eng.spawn(waiter("late", 2.0))
    eng.spawn(waiter("early", 1.0))
    eng.spawn(waiter("after", 6.0))  # starts waiting after the pulse: never woken
    eng.spawn(firer())
    eng.run()
    assert woke == [("early", 5.0, True), ("late", 5.0, True)]


def test_wait_with_timeout_reports_which_came_first() -> None:
    eng = Engine()
    sig = eng.signal()
    got: list[tuple[float, bool]] = []

    def waiter(timeout: float) -> ProcessGen:
        r = yield WaitSignal(sig, timeout=timeout)
        got.append((eng.now, r))

    def firer() -> ProcessGen:
        yield Timeout(2.0)
        sig.fire()

    eng.spawn(waiter(1.0))
    eng.spawn(waiter(3.0))
    eng.spawn(firer())
    eng.run()
    assert got == [(1.0, False), (2.0, True)]
    # The losing timeout of the second waiter was discarded, not delivered later.
    assert eng.now == 2.0


def test_event_is_latched() -> None:
    eng = Engine()
    ev = eng.event()
    got: list[float] = []

    def firer() -> ProcessGen:
        yield Timeout(1.0)
        ev.fire()

    def late() -> ProcessGen:
        yield Timeout(4.0)
        yield WaitSignal(ev)
        got.append(eng.now)

    eng.spawn(firer())
    eng.spawn(late())
    eng.run()
    assert got == [4.0]


def test_run_until_and_stop() -> None:
    eng = Engine()
    ticks: list[float] = []

    def ticker() -> ProcessGen:
        while True:
            yield Timeout(1.0)
            ticks.append(eng.now)

    eng.spawn(ticker())
    assert eng.run(until=3.5) == 3.5
    assert ticks == [1.0, 2.0, 3.0]
    eng.run(stop=lambda: len(ticks) >= 6)
    assert ticks[-1] == 6.0


def test_bad_commands_raise() -> None:
    eng = Engine()

    def negative() -> ProcessGen:
        yield Timeout(-1.0)

    eng.spawn(negative())
    with pytest.raises(InvalidRequestError, match="dt must be >= 0"):
        eng.run()

    eng2 = Engine()

    def junk() -> ProcessGen:
        yield "nope"  # type: ignore[misc]  # deliberately not a command

    eng2.spawn(junk())
    with pytest.raises(InvalidRequestError, match="expected Timeout or WaitSignal"):
        eng2.run()


def test_sim_clock_follows_engine_time() -> None:
    eng = Engine()
    clock = eng.clock

    def proc() -> ProcessGen:
        yield Timeout(7.5)

    eng.spawn(proc())
    eng.run()
    assert clock.now() == 7.5
    assert clock.wall() == clock.epoch + 7.5
    with pytest.raises(NotImplementedError):
        asyncio.run(clock.sleep(1.0))


def test_runs_are_deterministic() -> None:
    def trace() -> list[tuple[float, int]]:
        eng = Engine()
        sig = eng.signal()
        out: list[tuple[float, int]] = []

        def worker(i: int) -> ProcessGen:
            for _ in range(5):
                yield Timeout(0.5 * (i % 3))
                yield WaitSignal(sig, timeout=1.0 + i)
                out.append((eng.now, i))

        def pulser() -> ProcessGen:
            for _ in range(20):
                yield Timeout(0.75)
                sig.fire()

        for i in range(6):
            eng.spawn(worker(i))
        eng.spawn(pulser())
        eng.run()
        return out

    first = trace()
    assert len(first) == 30
    assert first == trace()
