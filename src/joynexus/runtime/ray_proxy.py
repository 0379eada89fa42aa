"""Make a Ray actor handle look like the service object it hosts.

The workflow loops (and the services themselves) call ``await service.method(...)`` and,
for a few cheap getters, ``service.method(...)``. :class:`ActorProxy` keeps exactly that
surface over an actor created with ``ray.remote(cls)``: a coroutine method of ``cls``
becomes a coroutine that awaits the actor call's ``ObjectRef``; a plain method becomes a
blocking ``ray.get`` (only cheap getters are plain methods); a property is read with
``__ray_call__``. Nothing of the service's logic is repeated here.

A callable cannot travel to an actor and still act on the driver's objects, so the one
callback argument the services take, ``heartbeat=`` (a producer / consumer lease), stays
in the caller: while the remote call runs the proxy calls it every
``heartbeat_interval_s``; if it raises (the lease is lost) the remote call is cancelled
and the error propagates, as it would in-process.

Proxies pickle (they hold only the actor handle), so one actor can be handed to another:
the inference actor reaches the environment actor and the Training Queue actor through
proxies.

Typing: ``ActorProxy[S]`` answers every attribute through ``__getattr__``, which a type
checker accepts for any method or read-only property of a protocol, so a proxy satisfies
the service protocols of :mod:`joynexus.services.protocols` structurally. What makes
that true at run time is the mapping above: every public member of ``S`` keeps its kind
(coroutine, plain method, property) through the proxy, and ``S`` itself is checked
against the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["ActorProxy", "async_methods", "await_ref"]

S = TypeVar("S")


def _ray() -> Any:
    import ray

    return ray


def async_methods(cls: type) -> frozenset[str]:
    """Names of ``cls``'s coroutine methods (awaited through ObjectRefs by a proxy)."""
    return frozenset(
        name
        for name, member in inspect.getmembers(cls)
        if not name.startswith("__") and inspect.iscoroutinefunction(member)
    )


def _properties(cls: type) -> frozenset[str]:
    return frozenset(
        name for name, member in inspect.getmembers(cls) if isinstance(member, property)
    )


async def await_ref(
    ref: Any, heartbeat: Callable[[], None] | None = None, interval_s: float = 1.0
) -> Any:
    """Await an ObjectRef, calling ``heartbeat`` every ``interval_s`` until it resolves.

    Raises:
        Whatever the remote call raised (Ray re-raises it as an instance of the original
        class), ``ray.exceptions.RayActorError`` if the actor died, or what ``heartbeat``
        raised (the remote call is then cancelled).
    """
    future: asyncio.Future[Any] = asyncio.ensure_future(ref)
    if heartbeat is None:
        return await future
    try:
        while True:
            done, _ = await asyncio.wait({future}, timeout=interval_s)
            if done:
                return future.result()
            heartbeat()
    except BaseException:
        if not future.done():
            with contextlib.suppress(Exception):
                _ray().cancel(ref)
            future.cancel()
        raise


class ActorProxy(Generic[S]):
    """The service-object surface of a Ray actor (see module docstring).

    Args:
        handle: The actor handle (``ray.remote(cls).options(...).remote(...)``).
        cls: The class the actor hosts.
        heartbeat_interval_s: How often a caller's ``heartbeat`` runs during a call.
    """

    def __init__(self, handle: Any, cls: type[S], *, heartbeat_interval_s: float = 1.0) -> None:
        self._handle = handle
        self._cls = cls
        self._async = async_methods(cls)
        self._props = _properties(cls)
        self._interval = heartbeat_interval_s

    @property
    def actor(self) -> Any:
        """The Ray actor handle."""
        return self._handle

    @property
    def service_class(self) -> type[S]:
        return self._cls

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._props:
            ref = self._handle.__ray_call__.remote(lambda svc, n=name: getattr(svc, n))
            return _ray().get(ref)
        method = getattr(self._handle, name)
        if name in self._async:
            interval = self._interval

            async def call_async(*args: Any, **kwargs: Any) -> Any:
                heartbeat = kwargs.pop("heartbeat", None)
                return await await_ref(method.remote(*args, **kwargs), heartbeat, interval)

            return call_async

        def call(*args: Any, **kwargs: Any) -> Any:
            return _ray().get(method.remote(*args, **kwargs))

        return call

    def __getstate__(self) -> dict[str, Any]:
        return {"handle": self._handle, "cls": self._cls, "interval": self._interval}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]  # re-run the constructor on unpickle
            state["handle"], state["cls"], heartbeat_interval_s=state["interval"]
        )

    def __repr__(self) -> str:
        return f"ActorProxy({self._cls.__name__})"
