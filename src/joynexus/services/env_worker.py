"""One simulator in its own process: the Environment Service's worker.

The parent (which may hold torch and many threads) starts workers with the
``forkserver`` context where available, else ``spawn`` — never plain ``fork``. A
worker builds its adapter from a picklable factory reference, then serves
``reset`` / ``step`` / ``close`` requests over a pipe until closed. A worker that
crashes (segfault, ``os._exit``) or hangs can only take its own session down: the
parent sees a closed pipe or a timeout, kills it and reports
:class:`~joynexus.errors.SimulatorCrashedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import multiprocessing
import multiprocessing.connection
import pickle
import traceback
from multiprocessing.process import BaseProcess
from typing import Any

from joynexus import errors
from joynexus.envs.base import EnvSpec
from joynexus.errors import EnvironmentServiceError, SimulatorCrashedError, SpecError
from joynexus.utils.affinity import pin_this_process
from joynexus.utils.device_clock import process_clock

__all__ = ["SimulatorWorker", "mp_context"]

_KILL_GRACE_S = 5.0


def mp_context() -> multiprocessing.context.BaseContext:
    """``forkserver`` where the platform has it (cheap starts, no inherited threads)."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if ctx.get_start_method() == "forkserver":
        # The fork server imports these once; every worker forked from it starts warm.
        ctx.set_forkserver_preload(["numpy", "pydantic", "joynexus.envs"])
    return ctx


def _error_reply(exc: BaseException) -> tuple[str, str, str, dict[str, Any]]:
    if isinstance(exc, errors.JoyNexusError):
        return ("error", type(exc).__name__, exc.message, exc.details)
    return ("error", "EnvironmentServiceError", f"{type(exc).__name__}: {exc}", {})


def _grouped_reset(adapter: Any, spec: EnvSpec, seed: int | None, group_size: int) -> Any:
    """``adapter.reset(seed, group_size=...)``; a clear error for an adapter without groups."""
    if "group_size" not in inspect.signature(adapter.reset).parameters:
        raise SpecError(
            f"env kind {spec.kind!r} cannot start a group of sub-envs from one initial "
            "state (its adapter's reset takes no group_size); drop algorithm.group_size "
            "or use an env kind that supports groups"
        )
    return adapter.reset(seed=seed, group_size=group_size)


def _worker_main(
    conn: multiprocessing.connection.Connection,
    factory: Any,
    spec_json: str,
    cores: list[int] | None = None,
) -> None:
    """Entry point of the worker process (runs in the child)."""
    from joynexus.envs.registry import resolve_callable

    if cores:
        # Before the simulator starts any thread: they all inherit the pinning.
        pin_this_process(cores)
    spec = EnvSpec.model_validate_json(spec_json)
    try:
        adapter = resolve_callable(factory)(spec)
        conn.send(("ok", adapter.schema.model_dump_json()))
    except BaseException as exc:
        traceback.print_exc()
        conn.send(_error_reply(exc))
        return
    while True:
        # Read before waiting for the request: a wake-up the core delayed counts too.
        before = process_clock()
        try:
            op, arg = conn.recv()
        except (EOFError, OSError):
            break  # the parent went away: nothing left to serve
        try:
            if op == "reset":
                seed, group_size = arg
                result: Any = (
                    adapter.reset(seed=seed)
                    if group_size == 1
                    else _grouped_reset(adapter, spec, seed, group_size)
                )
            elif op == "step":
                result = adapter.step(arg)
            elif op == "close":
                adapter.close()
                conn.send(("ok", None))
                break
            else:
                raise errors.InternalError(f"unknown worker op {op!r}")
            conn.send(("ok", result, _waited(before)))
        except Exception as exc:
            conn.send(_error_reply(exc))
    conn.close()


def _waited(before: tuple[float, float] | None) -> float | None:
    """This process's run-queue wait since ``before`` (None: not measurable here)."""
    after = process_clock()
    if before is None or after is None:
        return None
    return max(after[1] - before[1], 0.0)


class SimulatorWorker:
    """The parent's handle on one worker process.

    Calls are blocking pipe round trips run in a thread, so the event loop keeps
    serving other sessions while a simulator steps.
    """

    def __init__(self, process: BaseProcess, conn: multiprocessing.connection.Connection) -> None:
        self.process = process
        self.conn = conn
        self.dead_reason: str | None = None
        #: The worker's run-queue wait during the last call that answered (None: not
        #: measurable): seconds its simulator was ready to run while its core ran
        #: something else. The Environment Service reads it under the session's lock.
        self.last_wait_s: float | None = None

    @classmethod
    async def start(
        cls, factory: Any, spec: EnvSpec, *, timeout_s: float, cores: list[int] | None = None
    ) -> tuple[Any, str]:
        """Start a worker and build its simulator; returns ``(worker, schema_json)``.

        ``cores``: pin the worker process to these cores before the simulator is built
        (None: not pinned; see :mod:`joynexus.utils.affinity`).

        Raises:
            SpecError: The factory cannot be sent to a worker process.
            SimulatorCrashedError: The worker died or timed out while starting.
            JoyNexusError: Whatever the factory raised (re-raised with its class).
        """
        try:
            pickle.dumps(factory)
        except Exception as exc:
            raise SpecError(
                f"env kind {spec.kind!r} has a factory that cannot be sent to a worker "
                "process; register a module-level function or a 'module:function' string"
            ) from exc
        ctx = mp_context()
        parent, child = ctx.Pipe(duplex=True)
        process = ctx.Process(  # type: ignore[attr-defined]  # BaseContext stubs lack Process
            target=_worker_main,
            args=(child, factory, spec.model_dump_json(), cores),
            daemon=True,
            name=f"joynexus-env-{spec.kind}",
        )
        await asyncio.to_thread(process.start)
        child.close()
        worker = cls(process, parent)
        schema_json = await worker._roundtrip(None, timeout_s=timeout_s, what="start")
        return worker, str(schema_json)

    def _blocking_roundtrip(self, message: Any, timeout_s: float, what: str) -> Any:
        if self.dead_reason is not None:
            raise SimulatorCrashedError(self.dead_reason)
        try:
            if message is not None:
                self.conn.send(message)
            if not self.conn.poll(timeout_s):
                self._kill(f"the simulator did not answer {what} within {timeout_s:g} s (timeout)")
                raise SimulatorCrashedError(self.dead_reason or "timeout", timeout_s=timeout_s)
            reply = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as exc:
            self.process.join(timeout=_KILL_GRACE_S)
            self._kill(
                f"the simulator worker died during {what} "
                f"(exit code {self.process.exitcode}): {type(exc).__name__}"
            )
            raise SimulatorCrashedError(self.dead_reason or "crashed") from None
        if reply[0] == "ok":
            self.last_wait_s = reply[2] if len(reply) > 2 else None
            return reply[1]
        _, cls_name, message_text, details = reply
        cls = getattr(errors, cls_name, EnvironmentServiceError)
        if not (isinstance(cls, type) and issubclass(cls, errors.JoyNexusError)):
            cls = EnvironmentServiceError
        raise cls(message_text, **details)

    async def _roundtrip(self, message: Any, *, timeout_s: float, what: str) -> Any:
        return await asyncio.to_thread(self._blocking_roundtrip, message, timeout_s, what)

    async def call(self, op: str, arg: Any, *, timeout_s: float) -> Any:
        """Run ``op`` (``reset`` / ``step``) in the worker and return its result."""
        return await self._roundtrip((op, arg), timeout_s=timeout_s, what=op)

    def _kill(self, reason: str) -> None:
        if self.dead_reason is None:
            self.dead_reason = reason
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=_KILL_GRACE_S)
        self.conn.close()

    async def close(self, *, timeout_s: float = _KILL_GRACE_S) -> None:
        """Ask the worker to close its simulator; kill it if it does not in time."""
        if self.dead_reason is None:
            # Already dead or killed: the process is gone either way.
            with contextlib.suppress(errors.JoyNexusError):
                await self._roundtrip(("close", None), timeout_s=timeout_s, what="close")
            await asyncio.to_thread(self.process.join, timeout_s)
        self._kill("the session was closed")
