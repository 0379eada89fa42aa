"""A fake execution plane: the Master Service's services without a model or a simulator.

What is faked is only what is heavy; the rest is the real thing:

* real: the Training Scheduler (SQLite in the run directory), the Training Queue (in
  memory), the workload store, the checkpoint layout and manifest
  (:class:`~joynexus.models.checkpoints.payload.CheckpointManifest`, so the Master's own
  ledger reads work), the rollout / evaluation loops of :mod:`joynexus.services.rollout`
  (composed over the fake ``predict`` and the fake environment, exactly as the real
  Inference Model Service composes them), every workflow loop and the Master itself;
* fake (one module each under :mod:`tests.fakes`, re-exported here): the resident
  base model (:class:`FakeBase`: an id, camera slots and schema signatures), the
  Training Model Service (a per-tenant version counter and a few numpy "weights" that
  each microbatch updates, checkpointed to disk with the ledger), the Inference Model
  Service (versioned weights, deterministic zero actions) and the Environment Service
  (numpy sub-envs with fixed-length episodes).

The fakes keep the real services' contracts, and the suites under ``tests/contracts``
run the same assertions against both: the same errors for the same misuse (unknown
tenant → ``NotFoundError``, an older published version → ``ConflictError``, a short
partition → ``ConflictError``, another tenant's session → the unknown session's
``NotFoundError``, ...). They also keep the same suspension points: every call the
real service runs in a worker thread yields to the event loop here too, *after* its
effect (a version step, a checkpoint written), so a cancellation or a "kill" can land
exactly where it could land on the real plane. Hooks (``on_step``, ``on_saved``,
``fail_job``, ``rollout_delay_s``) let a test stop the plane at such a point.

Every training update records the job it came from in the weights (``applied``), and
checkpoints persist it: a test can check that the completed jobs are exactly the
updates in the weights.

:class:`FakeProcess` is one "process": its own event loop. ``kill()`` abandons it the
way ``kill -9`` would (no ``finally`` block, no ``aclose``; only what was committed to
SQLite and the checkpoints survives); :func:`open_fake_plane` on the same run directory
is the process that comes up next.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from joynexus.control.scheduler import TrainingScheduler
from joynexus.master.service import MasterService
from joynexus.master.store import SQLiteWorkloadStore, WorkloadStore
from joynexus.models.backbone import ResidentBaseModel
from joynexus.queues.training import TrainingQueue
from joynexus.utils.clock import Clock, SystemClock
from tests.fakes.base import FAKE_BASE_ID, FakeBase
from tests.fakes.environment import FakeEnvironmentService
from tests.fakes.inference import FakeInferenceService
from tests.fakes.specs import custom_spec, eval_spec, rl_spec
from tests.fakes.training import FakeTrainingService, checkpointed_state

__all__ = [
    "FAKE_BASE_ID",
    "FakeBase",
    "FakeEnvironmentService",
    "FakeInferenceService",
    "FakePlane",
    "FakeProcess",
    "FakeServer",
    "FakeTrainingService",
    "ProcessKilled",
    "checkpointed_state",
    "custom_spec",
    "eval_spec",
    "make_fake_master",
    "master_on",
    "open_fake_plane",
    "rl_spec",
    "served_app",
    "start_master",
]

T = TypeVar("T")

# ---------------------------------------------------------------------------- plane


@dataclass
class FakePlane:
    """One process's execution plane on a run directory (what ``build_plane`` gives).

    ``scheduler.sqlite`` (jobs and workload records) and ``outputs/`` (checkpoints)
    are what outlive the process; everything else is in memory.
    """

    run_dir: Path
    base: FakeBase
    scheduler: TrainingScheduler
    store: WorkloadStore
    queue: TrainingQueue
    env: FakeEnvironmentService
    training: FakeTrainingService
    inference: FakeInferenceService
    clock: Clock

    @property
    def output_root(self) -> Path:
        return self.run_dir / "outputs"

    def close(self) -> None:
        """Release the SQLite connections (committed state stays)."""
        self.store.close()
        self.scheduler.close()


def open_fake_plane(
    run_dir: Path,
    *,
    clock: Clock | None = None,
    store: WorkloadStore | None = None,
) -> FakePlane:
    """The fake plane of one process on ``run_dir``: the scheduler and (by default) the
    workload store in ``run_dir/scheduler.sqlite``, so a later call on the same
    directory recovers them."""
    clk: Clock = clock or SystemClock()
    run_dir.mkdir(parents=True, exist_ok=True)
    db = run_dir / "scheduler.sqlite"
    scheduler = TrainingScheduler.open(db, clock=clk, lease_ttl_s=30.0)
    if store is None:
        store = SQLiteWorkloadStore(db)
    fake_base = FakeBase()
    queue = TrainingQueue()
    env = FakeEnvironmentService()
    training = FakeTrainingService(fake_base, queue, output_dir=run_dir / "outputs", clock=clk)
    inference = FakeInferenceService(fake_base, env, queue)
    return FakePlane(run_dir, fake_base, scheduler, store, queue, env, training, inference, clk)


def master_on(plane: FakePlane, **kwargs: Any) -> MasterService:
    """A Master Service on ``plane`` (constructed like ``LocalRun.open`` builds it);
    ``kwargs`` go to :class:`MasterService` (limits, max_failures, ...; a fast
    ``poll_s`` unless given)."""
    kwargs.setdefault("poll_s", 0.002)
    return MasterService(
        base=cast(ResidentBaseModel, plane.base),
        base_model_id=plane.base.model_id,
        scheduler=plane.scheduler,
        queue=plane.queue,
        env=plane.env,
        training=plane.training,
        inference=plane.inference,
        output_root=plane.output_root,
        clock=plane.clock,
        store=plane.store,
        **kwargs,
    )


def make_fake_master(
    tmp_path: Path, store: WorkloadStore | None = None, **kwargs: Any
) -> MasterService:
    """A Master Service on a fresh fake plane in ``tmp_path`` (not started); ``kwargs``
    go to :func:`master_on`."""
    return master_on(open_fake_plane(tmp_path, store=store), **kwargs)


async def start_master(master: MasterService) -> MasterService:
    """Start the plane's serving and then the Master (the order ``LocalRun.open`` uses:
    the Inference Model Service first, then :meth:`MasterService.start`, which recovers
    what the run directory holds)."""
    await master.inference.start()
    await master.start()
    return master


def served_app(master: MasterService, tenants: Any) -> Any:
    """The HTTP app over ``master``'s plane with the workload and model routes, tenants
    from ``tenants`` (a :class:`~joynexus.server.auth.TenantStore`)."""
    from joynexus.server.app import create_app
    from joynexus.server.routes import models, workloads
    from joynexus.server.state import ServiceRegistry

    services = ServiceRegistry(
        tenants=tenants,
        scheduler=master.scheduler,
        training_queue=master.queue,
        environment=master.env,
        master=master,
    )
    return create_app(services=services, extra_routers=(workloads.router, models.router))


# -------------------------------------------------------------------------- process


class ProcessKilled(BaseException):
    """Raised by every method of an object whose process was killed.

    A ``BaseException`` (like ``CancelledError``), so the loops' ``except Exception``
    retry handlers never catch it and a dead coroutine unwinds instead of spinning.
    """


def _bury(obj: Any) -> None:
    """Make every public or private method of ``obj`` raise :class:`ProcessKilled`."""

    def dead(*_args: Any, **_kwargs: Any) -> Any:
        raise ProcessKilled(f"{type(obj).__name__} died with its process")

    for name in dir(type(obj)):
        if name.startswith("__"):
            continue
        attr = getattr(type(obj), name, None)
        if callable(attr) and not isinstance(attr, (type, property)):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(obj, name, dead)


class FakeProcess:
    """One "process" of the service: its own event loop.

    :meth:`run` drives a coroutine on it; :meth:`kill` abandons it like ``kill -9``
    (pending tasks never run again: no ``finally``, no ``aclose``; what they committed
    stays); :meth:`shutdown` is the orderly end (cancel what is left, close the loop).
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.dead = False

    def run(self, coro: Coroutine[Any, Any, T], *, timeout_s: float | None = 30.0) -> T:
        assert not self.dead, "this process was killed"

        async def bounded() -> T:
            return await asyncio.wait_for(coro, timeout_s)

        return self.loop.run_until_complete(bounded())

    def sleep(self, seconds: float) -> None:
        """Let the process run for ``seconds`` of wall time."""
        self.run(asyncio.sleep(seconds))

    def run_or_report(self, coro: Coroutine[Any, Any, T], *, timeout_s: float = 10.0) -> T:
        """:meth:`run`, but a timeout raises an AssertionError naming every task still
        pending, with its stack (a shutdown that hangs says what hangs it)."""
        assert not self.dead, "this process was killed"

        async def watched() -> T:
            task = asyncio.ensure_future(coro)
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
            if task in done:
                return task.result()
            me = asyncio.current_task()
            lines = []
            for other in asyncio.all_tasks():
                if other is me or other is task:
                    continue
                frames = [
                    f"{f.f_code.co_filename.rsplit('/', 3)[-1]}:{f.f_lineno} {f.f_code.co_name}"
                    for f in other.get_stack(limit=12)
                ]
                lines.append(f"  {other.get_name()}: " + " <- ".join(reversed(frames)))
            task.cancel()
            raise AssertionError(
                f"{getattr(coro, '__qualname__', coro)} not done within {timeout_s} s; "
                "other pending tasks:\n" + "\n".join(lines)
            )

        return self.loop.run_until_complete(watched())

    def run_until(
        self, predicate: Callable[[], bool], *, timeout_s: float = 10.0, what: str = ""
    ) -> None:
        """Run the process until ``predicate()`` holds (checked every 2 ms).

        Raises:
            AssertionError: it did not within ``timeout_s``.
        """

        async def wait() -> None:
            while not predicate():
                await asyncio.sleep(0.002)

        try:
            self.run(wait(), timeout_s=timeout_s)
        except TimeoutError:
            raise AssertionError(f"not reached within {timeout_s} s: {what}") from None

    def kill(self, *things: Any) -> None:
        """``kill -9``: drop the loop with its tasks where they are.

        ``things`` are what died with the process: the :class:`FakePlane` (its SQLite
        connections are closed; what was committed stays) and the Master. Their methods
        raise :class:`ProcessKilled` from now on, so nothing of the process can act on
        the world again; its coroutines are then finalized right here (their ``except``
        / ``finally`` blocks meet only dead objects and unwind).
        """
        if self.dead:
            return
        self.dead = True
        for thing in things:
            if isinstance(thing, FakePlane):
                thing.close()
                for part in (
                    thing.scheduler,
                    thing.store,
                    thing.queue,
                    thing.env,
                    thing.training,
                    thing.inference,
                ):
                    _bury(part)
            else:
                _bury(thing)
        tasks = asyncio.all_tasks(self.loop)
        self.loop.set_exception_handler(lambda _loop, _ctx: None)
        self.loop.close()
        for task in tasks:
            task._log_destroy_pending = False  # type: ignore[attr-defined]
            with contextlib.suppress(BaseException):
                task.get_coro().close()

    def shutdown(self) -> None:
        """Cancel every task left, let them finish, close the loop (idempotent)."""
        if self.dead:
            return
        self.dead = True
        loop = self.loop
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


class FakeServer:
    """A Master Service on the fake plane, in a :class:`FakeProcess` of its own.

    :meth:`restart` ends the process — ``kill=True``: ``kill -9``; else a clean
    ``aclose`` — and brings up a new one on the same run directory (a new Training
    Scheduler and workload store on the same ``scheduler.sqlite``, the same
    checkpoints, everything else fresh), whose Master recovers by itself.

    Args:
        run_dir: The run directory.
        clock: The clock of every process (default: the system clock).
        master_kwargs: For :func:`master_on` (poll_s, max_failures, limits, ...).
    """

    def __init__(self, run_dir: Path, *, clock: Clock | None = None, **master_kwargs: Any):
        self.run_dir = run_dir
        self.clock = clock
        self.master_kwargs = master_kwargs
        #: A clean close that takes longer fails (naming what still runs).
        self.aclose_timeout_s = 2.0
        self._open()

    def _open(self) -> None:
        self.process = FakeProcess()
        self.plane = open_fake_plane(self.run_dir, clock=self.clock)
        self.master = master_on(self.plane, **self.master_kwargs)
        self.process.run(start_master(self.master))

    def run(self, coro: Coroutine[Any, Any, T], *, timeout_s: float | None = 30.0) -> T:
        return self.process.run(coro, timeout_s=timeout_s)

    def run_until(
        self, predicate: Callable[[], bool], *, timeout_s: float = 10.0, what: str = ""
    ) -> None:
        self.process.run_until(predicate, timeout_s=timeout_s, what=what)

    def sleep(self, seconds: float) -> None:
        self.process.sleep(seconds)

    def restart(
        self,
        *,
        kill: bool,
        shutdown: Callable[[MasterService], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        """End this process and open the next one on the run directory.

        Args:
            kill: ``kill -9`` (else a clean close).
            shutdown: The clean close to run instead of ``master.aclose()`` (a test that
                interleaves it with other work); it must close the Master.
        """
        if kill:
            self.process.kill(self.plane, self.master)
        else:
            close = self.master.aclose() if shutdown is None else shutdown(self.master)
            self.process.run_or_report(close, timeout_s=self.aclose_timeout_s)
            self.process.shutdown()
            self.plane.close()
        self._open()

    def close(self) -> None:
        """Shut the current process down cleanly (idempotent)."""
        if self.process.dead:
            return
        with contextlib.suppress(AssertionError):
            self.process.run_or_report(self.master.aclose(), timeout_s=self.aclose_timeout_s)
        self.process.shutdown()
        self.plane.close()
