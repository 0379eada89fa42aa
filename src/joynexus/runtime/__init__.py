"""Where the services live.

* :mod:`joynexus.runtime.plane` — :func:`build_plane` (the one builder of an execution
  plane) and :func:`watch_plane` (its one health wiring);
* :mod:`joynexus.runtime.hosting` / :mod:`joynexus.runtime.ray_hosting` — the
  placements: :class:`InProcess`, :class:`EnginePoolPlacement`, :class:`RayPlacement`;
* :mod:`joynexus.runtime.health` / :mod:`joynexus.runtime.sessions` — the Health
  Manager and simulator-session recovery.

What runs on a plane is the Master Service's business (:mod:`joynexus.master`), for
``joynexus run``, ``serve`` and the demo alike.
"""

from __future__ import annotations

from joynexus.runtime.hosting import EnginePoolPlacement, InProcess, Placement, RuntimeConfig
from joynexus.runtime.plane import ExecutionPlane, build_plane, load_base_model, watch_plane
from joynexus.runtime.ray_hosting import RayPlacement

__all__ = [
    "EnginePoolPlacement",
    "ExecutionPlane",
    "InProcess",
    "Placement",
    "RayPlacement",
    "RuntimeConfig",
    "build_plane",
    "load_base_model",
    "watch_plane",
]
