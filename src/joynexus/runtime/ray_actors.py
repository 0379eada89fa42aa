"""The pieces of a service as a Ray actor: connecting to Ray, the actor classes, the
functions run inside an actor, and where an actor loads the backbone from.

:class:`~joynexus.runtime.ray_hosting.RayPlacement` places the actors; what runs in an
actor's process lives here so that the placement reads as the layout it builds.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from joynexus.api import UsageReport
from joynexus.errors import ServiceUnavailableError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.runtime.ray_proxy import ActorProxy, await_ref
from joynexus.spec.workload import BaseModelSpec

__all__ = [
    "BaseModelSource",
    "actor_class",
    "connect",
    "drain_usage",
    "engine_running",
    "is_engine_failure",
    "node_of",
    "queue_alive",
    "rendezvous",
    "spec_of",
    "when_up",
]


def connect(address: str | None = None, **init_kwargs: Any) -> bool:
    """Attach to a Ray cluster (``address="auto"`` or ``"host:port"``) or start a local
    one (``address=None``). Returns True if this call started Ray.

    A local cluster started here gets ``RAY_AUTH_MODE=disabled`` unless the caller set
    it: it accepts connections only from this machine's processes.
    """
    import ray

    if ray.is_initialized():
        return False
    if address is None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        init_kwargs.setdefault("include_dashboard", False)
        # "local": a new instance, never one another process left recorded on this
        # machine (a plain ray.init() would attach to it).
        address = "local"
    ray.init(address=address, **init_kwargs)
    return True


@dataclass(frozen=True)
class BaseModelSource:
    """Where an actor loads the resident backbone from, on its own node.

    Attributes:
        spec: The plane's base model (hub id, local path or ``tiny:<arch>``).
        cache_dir: Where a tiny model was built (the run directory's ``models``).
    """

    spec: BaseModelSpec
    cache_dir: Path

    def load(self) -> ResidentBaseModel:
        from joynexus.runtime.plane import load_base_model  # plane imports the placements

        return load_base_model(self.spec, self.cache_dir)


def actor_class(cls: type[Any], *, loads_base: bool = True) -> type[Any]:
    """``cls`` as an actor class: its constructor takes a :class:`BaseModelSource` in
    place of the base model and loads it in the actor's process (``loads_base``), and
    meters the service's work in a usage meter of the actor's own (a meter holds locks:
    it cannot be shipped), which the host drains (:func:`drain_usage`). Only the
    constructor differs; the proxy keeps ``cls`` as the class it mirrors."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        from joynexus.metrics.usage import UsageMeter

        if loads_base:
            args = (args[0].load(), *args[1:])
        self.actor_usage = kwargs["usage"] = UsageMeter()
        cls.__init__(self, *args, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": __name__})


def drain_usage(svc: Any) -> UsageReport:
    report: UsageReport = svc.actor_usage.drain()
    return report


def _where(_svc: Any) -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def node_of(proxy: ActorProxy[Any]) -> str:
    """The id of the node an actor runs on (waits for a restarting actor)."""
    import ray

    return str(ray.get(proxy.actor.__ray_call__.remote(_where)))


def rendezvous() -> tuple[str, int]:
    """A free TCP port on this node, for rank 0's process-group rendezvous."""
    import socket

    import ray

    host = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]  # untyped in ray
    with socket.socket() as sock:
        sock.bind((host, 0))
        return host, int(sock.getsockname()[1])


def _incarnation(_svc: Any) -> tuple[str, int]:
    """Which process hosts the actor now (node id, pid): it changes when Ray re-creates
    the actor after its node was lost."""
    import ray

    return str(ray.get_runtime_context().get_node_id()), os.getpid()


async def when_up(proxy: ActorProxy[Any], poll_s: float = 0.5) -> tuple[str, int]:
    """The actor's incarnation, waiting while Ray re-creates it (after its node was
    lost the actor is "restarting" until its bundle is re-placed on a node that fits:
    :meth:`~joynexus.runtime.ray_hosting.RayHosting.waiting_for` says what it waits
    for). An actor that is dead for good raises."""
    from ray.exceptions import ActorUnavailableError

    while True:
        try:
            incarnation: tuple[str, int] = await await_ref(
                proxy.actor.__ray_call__.remote(_incarnation)
            )
            return incarnation
        except ActorUnavailableError:
            await asyncio.sleep(poll_s)


def engine_running(svc: Any) -> bool:
    """Run in an engine actor: whether its Inference Queue is serving."""
    return bool(svc.inference_queue.running)


def queue_alive(svc: Any) -> bool:
    """Run in the Training Queue actor: answering at all is the liveness probe."""
    return True


def is_engine_failure(error: BaseException) -> bool:
    from ray.exceptions import RayActorError

    return isinstance(error, RayActorError | ServiceUnavailableError)


def spec_of(base: ResidentBaseModel) -> BaseModelSpec:
    """A spec that reloads ``base`` from where it was loaded (a plane built around an
    already loaded model)."""
    # ``model_id`` is what load_base_model resolves: a hub id, a path, or a tiny model's
    # spec id (rebuilt, or found, in the actor's cache directory).
    return BaseModelSpec(
        id=base.model_id,
        device=str(base.device.type),
        canonical_image_size=base.canonical_image_size,
        canonicalizer=base.canonicalizer,
    )
