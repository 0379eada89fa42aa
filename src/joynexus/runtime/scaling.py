"""Elastic pool of rollout engines (paper §4.1.3, "Elastic scaling").

:class:`EnginePool` puts several Inference Model Service instances (in process, or Ray
actors through a proxy) behind the one surface the workflow loops use
(``current_policy_version``, ``load_weights``, ``rollout``, ``evaluate``, ``predict``):

* **dispatch**: each call goes to the admitted engine with the fewest outstanding calls
  relative to its admission weight; the pool counts outstanding calls per engine.
* **weights**: ``add_tenant`` / ``load_weights`` are broadcast to every engine, and the
  pool records each tenant's latest published payload, so a new (or restarted) engine is
  synchronised to exactly what the others serve.
* **scale out**: start an engine, sync every tenant's current weights, then admit it
  gradually: its weight rises through ``admission_steps`` as it answers calls.
* **scale in**: stop dispatching to an engine, wait until its outstanding calls drained,
  then stop and release it.
* scaling operations are serialized by one lock, and all-or-nothing: a failure rolls the
  pool back to the engines it had (new ones are stopped and released).

The pool satisfies :class:`~joynexus.services.protocols.InferenceModelServiceAPI` (its
``metrics`` add up the engines' Inference Queue counters), so the plane hands it to the
Master and the workflow loops in place of one engine.

:class:`~joynexus.runtime.autoscale.Autoscaler` is the optional policy that resizes the
pool; :func:`~joynexus.runtime.engine_metrics.combine_metrics` adds up the engines'
queue metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar

from pydantic import BaseModel, ConfigDict

from joynexus.errors import (
    CapacityError,
    DeadlineExceededError,
    InvalidRequestError,
    NotFoundError,
    ServiceUnavailableError,
)
from joynexus.models.checkpoints.payload import TenantPayload
from joynexus.queues.inference_metrics import InferenceQueueMetrics
from joynexus.runtime.engine_metrics import combine_metrics
from joynexus.services.protocols import InferenceModelServiceAPI
from joynexus.services.tenancy import TenantConfig
from joynexus.utils.clock import Clock, SystemClock

if TYPE_CHECKING:
    import torch


__all__ = [
    "EngineHandle",
    "EnginePool",
    "EngineState",
    "EngineStatus",
    "combine_metrics",
]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


def _on_engine(
    method: Callable[Concatenate[InferenceModelServiceAPI, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[EnginePool, P], Coroutine[Any, Any, R]]:
    """``method`` of the protocol as a pool method: the call goes to the engine that
    :meth:`EnginePool._dispatch` picks, with the caller's arguments as they are."""
    name = method.__name__

    async def on_engine(pool: EnginePool, /, *args: P.args, **kwargs: P.kwargs) -> R:
        async with pool._dispatch() as m:
            result: R = await getattr(m.handle.engine, name)(*args, **kwargs)
            return result

    # __wrapped__: help() and inspect.signature show the protocol's parameters.
    functools.update_wrapper(on_engine, method, assigned=(), updated=())
    on_engine.__name__ = name
    on_engine.__qualname__ = f"EnginePool.{name}"
    on_engine.__doc__ = method.__doc__ or f"``{name}`` on the engine the pool dispatches to."
    return on_engine


EngineState = Literal["warming", "serving", "draining"]


@dataclass
class EngineHandle:
    """A started engine plus how to probe and release it.

    Attributes:
        engine: An Inference Model Service (in process, or a Ray actor's proxy).
        release: Frees its resources after ``stop`` (a Ray actor is killed).
        probe: Raises if the engine is not alive (the Health Manager calls it).
    """

    engine: InferenceModelServiceAPI
    release: Callable[[], Awaitable[None]] | None = None
    probe: Callable[[], Awaitable[None]] | None = None


#: Builds and starts engine number ``slot`` (0-based), or raises.
EngineFactory = Callable[[int], Awaitable[EngineHandle]]


@dataclass
class _Member:
    engine_id: int
    slot: int
    handle: EngineHandle
    state: EngineState
    weight: float
    step: int = 0
    answered: int = 0
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


class EngineStatus(BaseModel):
    """One engine of the pool, as ``status()`` reports it."""

    model_config = ConfigDict(extra="forbid")

    engine_id: int
    slot: int
    state: EngineState
    weight: float
    in_flight: int
    answered: int


class EnginePool:
    """Rollout engines behind one inference surface (see module docstring).

    Args:
        factory: Builds and starts one engine for a slot.
        clock: Drain timeouts.
        max_engines: Upper bound (the layout's inference bundle share); None = unbounded.
        admission_steps: Dispatch weights a new engine goes through, ending at 1.
        answers_per_step: Calls a new engine answers before its weight steps up.
        drain_timeout_s: How long scale-in waits for outstanding calls.
        serving_wait_s: How long a call waits for an engine while none serves (restart).
        is_engine_failure: Which exceptions of a call mean the engine itself failed.
        on_engine_failure: Told (engine id, error) about such failures (Health Manager).

    Attributes:
        on_resize: Called after every scaling operation and after :meth:`stop`, whether
            it changed the engines or not (the health wiring re-syncs its roles).
    """

    def __init__(
        self,
        factory: EngineFactory,
        *,
        clock: Clock | None = None,
        max_engines: int | None = None,
        admission_steps: Sequence[float] = (0.25, 0.5, 1.0),
        answers_per_step: int = 2,
        drain_timeout_s: float = 300.0,
        serving_wait_s: float = 120.0,
        is_engine_failure: Callable[[BaseException], bool] | None = None,
        on_engine_failure: Callable[[int, BaseException], Awaitable[None]] | None = None,
    ) -> None:
        if not admission_steps or admission_steps[-1] != 1.0:
            raise InvalidRequestError(
                f"admission_steps must end at 1.0, got {list(admission_steps)}"
            )
        self._factory = factory
        self.clock: Clock = clock or SystemClock()
        self.max_engines = max_engines
        self._steps = tuple(float(s) for s in admission_steps)
        self._answers_per_step = answers_per_step
        self._drain_timeout_s = drain_timeout_s
        self._serving_wait_s = serving_wait_s
        self._changed = asyncio.Event()
        self._reports: set[asyncio.Future[None]] = set()
        self._is_failure = is_engine_failure or (lambda e: isinstance(e, ServiceUnavailableError))
        self.on_engine_failure = on_engine_failure
        self.on_resize: Callable[[], None] | None = None
        self._members: list[_Member] = []
        self._next_id = 0
        self._scale_lock = asyncio.Lock()
        self._weights_lock = asyncio.Lock()
        self._configs: dict[str, TenantConfig] = {}
        self._payloads: dict[str, TenantPayload | None] = {}
        self._versions: dict[str, int] = {}

    # ------------------------------------------------------------------ inspection

    @property
    def size(self) -> int:
        return len(self._members)

    def status(self) -> list[EngineStatus]:
        return [
            EngineStatus(
                engine_id=m.engine_id,
                slot=m.slot,
                state=m.state,
                weight=m.weight,
                in_flight=m.in_flight,
                answered=m.answered,
            )
            for m in self._members
        ]

    def engine(self, engine_id: int) -> InferenceModelServiceAPI:
        return self._member(engine_id).handle.engine

    def handle(self, engine_id: int) -> EngineHandle:
        return self._member(engine_id).handle

    def engine_ids(self) -> list[int]:
        return [m.engine_id for m in self._members]

    @property
    def in_flight(self) -> int:
        """Outstanding calls over all engines (the pressure the autoscaler reads)."""
        return sum(m.in_flight for m in self._members)

    @property
    def metrics(self) -> InferenceQueueMetrics:
        """The Inference Queue metrics of the engines in the pool now, added up
        (:func:`combine_metrics`); an engine's counters leave with it."""
        return combine_metrics([m.handle.engine.metrics for m in self._members])

    def _member(self, engine_id: int) -> _Member:
        for m in self._members:
            if m.engine_id == engine_id:
                return m
        raise NotFoundError(
            f"rollout engine {engine_id} is not in the pool; engines: {self.engine_ids()}"
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self, engines: int = 1) -> None:
        """Start the first ``engines`` engines (fully admitted)."""
        await self.scale_to(engines, gradual=False)

    async def stop(self) -> None:
        """Stop and release every engine (the pool can be started again)."""
        async with self._scale_lock:
            members, self._members = self._members, []
            try:
                for m in members:
                    await self._release(m)
            finally:
                self._resized()

    def _resized(self) -> None:
        if self.on_resize is not None:
            self.on_resize()

    async def _release(self, m: _Member) -> None:
        with contextlib.suppress(Exception):
            await m.handle.engine.stop()
        if m.handle.release is not None:
            with contextlib.suppress(Exception):
                await m.handle.release()

    # ------------------------------------------------------------------ tenants / weights

    async def add_tenant(self, config: TenantConfig, payload: TenantPayload | None = None) -> None:
        """Serve a tenant on every engine (and on every engine started later)."""
        async with self._weights_lock:
            await self._broadcast("add_tenant", config, payload)
            self._configs[config.tenant_id] = config
            self._payloads[config.tenant_id] = payload
            self._versions[config.tenant_id] = payload.policy_version if payload else 0

    async def remove_tenant(self, tenant_id: str) -> None:
        async with self._weights_lock:
            await self._broadcast("remove_tenant", tenant_id)
            self._configs.pop(tenant_id, None)
            self._payloads.pop(tenant_id, None)
            self._versions.pop(tenant_id, None)

    async def load_weights(
        self, tenant_id: str, version: int, named_tensors: Mapping[str, torch.Tensor]
    ) -> None:
        """Publish ``version`` on every engine and record it for engines started later."""
        async with self._weights_lock:
            await self._broadcast("load_weights", tenant_id, version, named_tensors)
            config = self._configs.get(tenant_id)
            if config is not None:
                old = self._payloads.get(tenant_id)
                signature = old.schema_signature if old is not None else ""
                self._payloads[tenant_id] = TenantPayload(
                    tenant_id=tenant_id,
                    policy_version=version,
                    schema_signature=signature,
                    named_tensors=dict(named_tensors),
                )
            self._versions[tenant_id] = version

    async def _broadcast(self, method: str, *args: Any) -> None:
        """Call ``method`` on every engine. A failed engine is skipped and reported: its
        restart syncs it from the record this call updates."""
        for m in list(self._members):
            try:
                await getattr(m.handle.engine, method)(*args)
            except Exception as error:
                if not self._is_failure(error):
                    raise
                self._report(m, error)

    def _report(self, m: _Member, error: BaseException) -> None:
        log.warning("rollout engine %s failed: %s", m.engine_id, error)
        if self.on_engine_failure is not None:
            task = asyncio.ensure_future(self.on_engine_failure(m.engine_id, error))
            self._reports.add(task)  # keep a reference until the report is handled
            task.add_done_callback(self._reports.discard)

    def current_policy_version(self, tenant_id: str) -> int:
        try:
            return self._versions[tenant_id]
        except KeyError:
            raise NotFoundError(
                f"tenant {tenant_id!r} is not served", tenant_id=tenant_id
            ) from None

    def published(self, tenant_id: str) -> TenantPayload | None:
        """The tenant's latest published payload (None: still at its initial weights)."""
        return self._payloads.get(tenant_id)

    async def _sync(self, engine: InferenceModelServiceAPI) -> None:
        """Bring a fresh engine to every tenant's latest published weights."""
        for tenant_id, config in self._configs.items():
            payload = self._payloads.get(tenant_id)
            if payload is not None and not payload.schema_signature:
                # Published before any payload was known: give the engine the tensors
                # through load_weights after adding the tenant at version 0.
                await engine.add_tenant(config, None)
                await engine.load_weights(tenant_id, payload.policy_version, payload.named_tensors)
            else:
                await engine.add_tenant(config, payload)

    # ------------------------------------------------------------------ dispatch

    def _candidates(self) -> list[_Member]:
        return [m for m in self._members if m.state != "draining" and m.weight > 0]

    async def _pick(self) -> _Member:
        # While the only engine restarts, callers wait for it instead of failing.
        deadline = self.clock.now() + self._serving_wait_s
        while not self._candidates():
            if not self._members or self.clock.now() >= deadline:
                raise ServiceUnavailableError(
                    "no rollout engine is serving (the pool is empty, or every engine drains "
                    f"or restarts for longer than {self._serving_wait_s} s)"
                )
            self._changed.clear()
            waiter = asyncio.ensure_future(self._changed.wait())
            timer = asyncio.ensure_future(self.clock.sleep(min(1.0, self._serving_wait_s)))
            try:
                await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                timer.cancel()
        return min(self._candidates(), key=lambda m: ((m.in_flight + 1) / m.weight, m.engine_id))

    @contextlib.asynccontextmanager
    async def _dispatch(self) -> AsyncIterator[_Member]:
        m = await self._pick()
        m.in_flight += 1
        m.idle.clear()
        try:
            yield m
        except BaseException as error:
            if not isinstance(error, asyncio.CancelledError) and self._is_failure(error):
                self._report(m, error)
                if not isinstance(error, ServiceUnavailableError):
                    # A dead engine (a Ray actor error, say) is a role being restarted
                    # to every caller: the Master waits such an answer out (publish,
                    # held-out error, final success) instead of failing the workload.
                    raise ServiceUnavailableError(
                        f"rollout engine {m.engine_id} failed and is being restarted: {error}"
                    ) from error
            raise
        else:
            m.answered += 1
            if m.state == "warming" and m.answered % self._answers_per_step == 0:
                m.step = min(m.step + 1, len(self._steps) - 1)
                m.weight = self._steps[m.step]
                if m.weight >= 1.0:
                    m.state = "serving"
        finally:
            m.in_flight -= 1
            if m.in_flight == 0:
                m.idle.set()

    # Dispatched calls, derived from the protocol: the signatures are written once
    # (services.protocols), so the pool cannot drift from what an engine answers.
    predict = _on_engine(InferenceModelServiceAPI.predict)
    rollout = _on_engine(InferenceModelServiceAPI.rollout)
    evaluate = _on_engine(InferenceModelServiceAPI.evaluate)

    # ------------------------------------------------------------------ scaling

    async def scale_to(self, n: int, *, gradual: bool = True) -> int:
        """Scale the pool to ``n`` engines; returns the new size.

        Raises:
            InvalidRequestError: ``n`` < 1.
            CapacityError: ``n`` > ``max_engines``.
            ServiceUnavailableError: an engine failed to start (the pool was rolled back).
            DeadlineExceededError: an engine did not drain in time (rolled back).
        """
        return await self._scale(lambda _size: n, gradual)

    async def scale_out(self, k: int = 1) -> int:
        """Add ``k`` engines (relative to the size when this operation's turn comes)."""
        return await self._scale(lambda size: size + k, True)

    async def scale_in(self, k: int = 1) -> int:
        """Remove ``k`` engines (relative to the size when this operation's turn comes)."""
        return await self._scale(lambda size: size - k, True)

    async def _scale(self, target: Callable[[int], int], gradual: bool) -> int:
        async with self._scale_lock:
            try:
                return await self._scale_locked(target(len(self._members)), gradual)
            finally:
                self._resized()

    async def _scale_locked(self, n: int, gradual: bool) -> int:
        if n < 1:
            raise InvalidRequestError(f"a rollout pool needs at least 1 engine, asked for {n}")
        if self.max_engines is not None and n > self.max_engines:
            raise CapacityError(
                f"asked for {n} rollout engines; this placement holds at most {self.max_engines}"
            )
        if n > len(self._members):
            await self._scale_out(n - len(self._members), gradual)
        elif n < len(self._members):
            await self._scale_in(len(self._members) - n)
        return len(self._members)

    def _free_slot(self) -> int:
        used = {m.slot for m in self._members}
        return next(i for i in range(len(used) + 1) if i not in used)

    async def _scale_out(self, k: int, gradual: bool) -> None:
        added: list[_Member] = []
        try:
            for _ in range(k):
                slot = self._free_slot()
                handle = await self._factory(slot)
                m = _Member(self._next_id, slot, handle, state="warming", weight=0.0)
                self._next_id += 1
                self._members.append(m)  # before the sync: weight broadcasts reach it too
                added.append(m)
                async with self._weights_lock:
                    await self._sync(handle.engine)
                if gradual:
                    m.weight = self._steps[0]
                    m.state = "serving" if m.weight >= 1.0 else "warming"
                else:
                    m.weight, m.state, m.step = 1.0, "serving", len(self._steps) - 1
                self._changed.set()
        except BaseException as error:
            for m in added:
                m.state = "draining"
            for m in added:
                await m.idle.wait()
                self._members.remove(m)
                await self._release(m)
            if isinstance(error, Exception):
                raise ServiceUnavailableError(
                    f"scale-out by {k} failed ({type(error).__name__}: {error}); rolled back "
                    f"to {len(self._members)} engine(s)"
                ) from error
            raise

    async def _scale_in(self, k: int) -> None:
        # The newest engines go first: the ones still warming carry the least state.
        leaving = sorted(self._members, key=lambda m: m.engine_id)[-k:]
        previous = {m.engine_id: m.state for m in leaving}
        for m in leaving:
            m.state = "draining"
        waits = [asyncio.ensure_future(m.idle.wait()) for m in leaving]
        timeout = asyncio.ensure_future(self.clock.sleep(self._drain_timeout_s))
        all_idle: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*waits))
        racers: set[asyncio.Future[Any]] = {all_idle, timeout}
        try:
            await asyncio.wait(racers, return_when=asyncio.FIRST_COMPLETED)
        finally:
            all_idle.cancel()
            timeout.cancel()
            for w in waits:
                w.cancel()
        busy = [m for m in leaving if m.in_flight > 0]
        if busy:
            for m in leaving:
                m.state = previous[m.engine_id]
            raise DeadlineExceededError(
                f"scale-in: engines {[m.engine_id for m in busy]} still had outstanding "
                f"calls after {self._drain_timeout_s} s; rolled back (nothing released)"
            )
        for m in leaving:
            self._members.remove(m)
            await self._release(m)

    async def restart_engine(self, engine_id: int) -> None:
        """Replace a failed engine in place (same slot), synced to the published weights.

        Raises:
            NotFoundError: no such engine.
            Whatever the factory or the sync raised (the old engine stays listed).
        """
        async with self._scale_lock:
            old = self._member(engine_id)
            old.state = "draining"
            try:
                handle = await self._factory(old.slot)
                async with self._weights_lock:
                    try:
                        await self._sync(handle.engine)
                    except BaseException:
                        await self._release(_Member(-1, old.slot, handle, "draining", 0.0))
                        raise
            except BaseException:
                old.state = "serving"
                self._changed.set()
                raise
            await self._release(old)
            new = _Member(old.engine_id, old.slot, handle, state="serving", weight=1.0)
            new.step = len(self._steps) - 1
            self._members[self._members.index(old)] = new
            self._changed.set()
