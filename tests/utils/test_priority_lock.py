"""PriorityRLock: predict batches cut in line, a training step yields to them between
phases, and neither side can starve the other."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from joynexus.utils.priority_lock import PriorityRLock

WAIT_S = 10.0


def _until(cond: Callable[[], bool]) -> None:
    """Block until ``cond`` holds (another thread is parked on the lock)."""
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.001)):
        if cond():
            return
        done.wait(0.001)
    raise AssertionError("the other thread never blocked on the lock")


def _waiters(lock: PriorityRLock) -> tuple[int, int]:
    return lock._priority_waiting, lock._ordinary_waiting


def _start(lock: PriorityRLock, name: str, order: list[str], *, priority: bool) -> threading.Thread:
    def run() -> None:
        if priority:
            with lock.priority():
                order.append(name)
        else:
            with lock:
                order.append(name)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_priority_acquirer_goes_before_an_ordinary_one_already_waiting() -> None:
    lock, order = PriorityRLock(), []
    lock.acquire()
    ordinary = _start(lock, "train", order, priority=False)
    _until(lambda: _waiters(lock) == (0, 1))
    serving = _start(lock, "predict", order, priority=True)
    _until(lambda: _waiters(lock) == (1, 1))
    lock.release()
    ordinary.join(WAIT_S)
    serving.join(WAIT_S)
    assert order == ["predict", "train"]


def test_a_holder_yields_to_the_waiting_predicts_and_resumes_before_anything_ordinary() -> None:
    lock, order = PriorityRLock(), []
    assert lock.acquire() is None
    assert lock.yield_to_priority() is False  # nobody waits: no yield
    ordinary = _start(lock, "other-step", order, priority=False)
    _until(lambda: _waiters(lock) == (0, 1))
    serving = [_start(lock, f"predict{i}", order, priority=True) for i in range(2)]
    _until(lambda: _waiters(lock) == (2, 1))
    assert lock.yield_to_priority() is True
    order.append("step-resumed")
    assert lock.held_by_me()
    lock.release()
    for t in (ordinary, *serving):
        t.join(WAIT_S)
    assert sorted(order[:2]) == ["predict0", "predict1"]
    assert order[2:] == ["step-resumed", "other-step"]  # never inside the yielded step


def test_a_nested_holder_does_not_yield() -> None:
    lock, order = PriorityRLock(), []
    with lock, lock:
        serving = _start(lock, "predict", order, priority=True)
        _until(lambda: lock.priority_waiting == 1)
        assert lock.yield_to_priority() is False
        assert order == []
    serving.join(WAIT_S)
    assert order == ["predict"]


def test_a_stream_of_predicts_does_not_starve_a_waiting_step() -> None:
    lock, order = PriorityRLock(max_bypass=2), []
    lock.acquire()
    step = _start(lock, "step", order, priority=False)
    _until(lambda: _waiters(lock) == (0, 1))
    serving = []
    for i in range(4):
        serving.append(_start(lock, f"p{i}", order, priority=True))
        _until(lambda n=i + 1: _waiters(lock) == (n, 1))  # type: ignore[misc]
    lock.release()
    for t in (step, *serving):
        t.join(WAIT_S)
    assert order.index("step") == 2  # two predicts passed it, then it went


def test_reentry_and_release_by_another_thread() -> None:
    lock = PriorityRLock()
    with lock, lock.priority():  # re-entry of either kind is immediate
        assert lock.held_by_me()
    assert not lock.held_by_me()
    lock.acquire()
    errors: list[BaseException] = []

    def foreign() -> None:
        try:
            lock.release()
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=foreign)
    t.start()
    t.join(WAIT_S)
    lock.release()
    assert len(errors) == 1 and "not held" in str(errors[0])
    with pytest.raises(RuntimeError):
        lock.yield_to_priority()


def test_without_priorities_it_is_a_plain_reentrant_lock() -> None:
    lock, order = PriorityRLock(prioritize=False), []
    lock.acquire()
    ordinary = _start(lock, "train", order, priority=False)
    _until(lambda: _waiters(lock) == (0, 1))
    serving = _start(lock, "predict", order, priority=True)
    _until(lambda: _waiters(lock) == (0, 2))  # the predict waits as an ordinary acquirer
    assert lock.yield_to_priority() is False
    lock.release()
    ordinary.join(WAIT_S)
    serving.join(WAIT_S)
    assert sorted(order) == ["predict", "train"]
