"""A live server: the execution plane, the Master Service and the HTTP app around them.

:func:`build_plane` (from :mod:`joynexus.runtime.plane`, the one builder the runtimes
use too) loads the resident base model and places the long-lived services (durable
Training Scheduler in the run directory, Training Queue, Environment / Training /
Inference Model Services) exactly once, where its placement puts them (``joynexus
serve``: an elastic pool of in-process rollout engines, or Ray actors);
:func:`build_live_app` wraps them in a :class:`~joynexus.master.host.MasterHost`
and the FastAPI app with the workload, model and admin engine routers, starting the
plane and the Master's shared loops in the app's lifespan (inside the server's event
loop) and stopping them at shutdown. Releasing the plane (``plane.close()``: Ray
actors, placement group) is the caller's, after the server stopped.

Monitoring: the plane owns one :class:`~joynexus.metrics.MetricsService` (Prometheus
registry behind ``/metrics``, with the usage meter's counters) and one
:class:`~joynexus.metrics.UsageMeter` persisted to ``<run_dir>/usage.json`` (resumed
by a restarted server), both handed to the services. The live app adds a
:class:`~joynexus.metrics.control.ControlSampler` and the dashboard's
:class:`~joynexus.server.dashboard.DashboardFeed`, sampled by one lifespan task.

The Master, its durable workload store and the health wiring are a
:class:`~joynexus.master.host.MasterHost` — the same object ``joynexus run`` hosts — so
a restarted server on the same run directory resumes every workload by itself, a
crashed session or engine is repaired in place, the training role restarts from the
checkpoints, and a spent recovery budget fails the live workloads with the reason
(``/readyz`` then answers 503 with it; the dashboard shows the Health Manager's roles
and events).

Scaling: ``/v1/admin/engines`` (:mod:`joynexus.server.routes.engines`) reads and scales
the plane's rollout-engine pool.

Unlike :mod:`joynexus.server.app`, this module imports torch: it is what
``joynexus serve`` and the end-to-end tests run.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from joynexus.master.host import MasterHost
from joynexus.master.limits import MasterLimits
from joynexus.master.service import MasterService
from joynexus.master.store import InMemoryWorkloadStore, WorkloadStore
from joynexus.metrics.control import ControlSampler
from joynexus.metrics.usage import UsageMeter
from joynexus.runtime.hosting import RuntimeConfig
from joynexus.runtime.plane import ExecutionPlane, build_plane
from joynexus.server.app import create_app
from joynexus.server.auth import TenantStore
from joynexus.server.config import ServerConfig
from joynexus.server.dashboard import DashboardFeed
from joynexus.server.openpi import OPENPI, OpenPIGateway
from joynexus.server.routers import live_routers
from joynexus.server.routes import dashboard, engines
from joynexus.server.routes import health as health_routes
from joynexus.server.routes import metrics as metrics_routes
from joynexus.server.routes.metrics import MetricsAuth
from joynexus.server.state import ServiceRegistry
from joynexus.utils.clock import Clock, SystemClock

if TYPE_CHECKING:
    from joynexus.runtime.health import HealthManager

__all__ = [
    "ExecutionPlane",
    "LiveServer",
    "build_live_app",
    "build_plane",
    "ensure_admin_key",
]

log = logging.getLogger(__name__)


@dataclass
class LiveServer:
    app: FastAPI
    master: MasterService
    plane: ExecutionPlane
    tenants: TenantStore
    host: MasterHost
    dashboard: DashboardFeed | None = None
    sampler: ControlSampler | None = None


async def _sample(
    sampler: ControlSampler | None,
    feed: DashboardFeed,
    usage: UsageMeter | None,
    clock: Clock,
    interval_s: float,
) -> None:
    """Poll the control signals and the usage meter for the dashboard, forever."""
    while True:
        try:
            if sampler is not None:
                sampler.poll()
            if usage is not None:
                feed.sample_usage(usage.snapshot())
        except Exception:  # monitoring must not take the server down; the next tick retries
            log.exception("sampling control signals / usage failed")
        await clock.sleep(interval_s)


def build_live_app(
    plane: ExecutionPlane,
    tenants: TenantStore,
    *,
    output_root: Path,
    store: WorkloadStore | None = None,
    config: ServerConfig | None = None,
    limits: MasterLimits | None = None,
    clock: Clock | None = None,
    runtime: RuntimeConfig | None = None,
    health: HealthManager | None = None,
    metrics_auth: MetricsAuth = "none",
    sample_interval_s: float = 1.0,
    dashboard_bucket_s: float = 5.0,
) -> LiveServer:
    """The HTTP app over a :class:`~joynexus.master.host.MasterHost` on ``plane``; the
    lifespan starts and stops it.

    Args:
        store: The durable workload store (``joynexus serve``: the run directory's
            SQLite database, next to the scheduler's jobs); None: in memory.
        runtime: Loop knobs of the Master (poll period, failure budget).
        health: A Health Manager: the host registers the plane's roles with it, runs
            it in the lifespan; the dashboard shows its roles and events (admins) and
            ``/readyz`` reports an escalation.
        metrics_auth: ``"none"``: ``/metrics`` answers without a key (scrapers);
            ``"admin"``: it needs an admin key.
        sample_interval_s: Period of the control-signal and usage sampling.
        dashboard_bucket_s: Width of a bucket of the dashboard's utilization timeline.
    """
    clk = clock or SystemClock()
    host = MasterHost(
        plane,
        store=store if store is not None else InMemoryWorkloadStore(),
        output_root=output_root,
        limits=limits,
        config=runtime,
        clock=clk,
        health=health,
    )
    master = host.master
    feed = DashboardFeed(bucket_s=dashboard_bucket_s)
    sampler: ControlSampler | None = None
    extras: dict[str, Any] = {
        engines.PLANE: plane,
        metrics_routes.METRICS_AUTH: metrics_auth,
        health_routes.READINESS: host.readiness,
        OPENPI: OpenPIGateway(),  # openpi's websocket protocol (/v1/openpi, --openpi-port)
    }
    extras[dashboard.DASHBOARD] = feed
    if plane.metrics is not None:
        plane.metrics.subscribe(feed, categories=["learning"], name="dashboard")
        sampler = ControlSampler(
            plane.metrics,
            scheduler=plane.scheduler,
            training_queue=plane.queue,
            inference_metrics=lambda: plane.inference.metrics,
            policy_version=plane.training.policy_version,
        )
        extras[metrics_routes.METRICS] = plane.metrics
    if plane.usage is not None:
        extras[metrics_routes.USAGE] = plane.usage
    if health is not None:
        extras[dashboard.HEALTH] = health
    services = ServiceRegistry(
        tenants=tenants,
        scheduler=plane.scheduler,
        training_queue=plane.queue,
        environment=plane.env,
        master=master,
        extras=extras,
    )
    app = create_app(
        config=config,
        services=services,
        clock=clk,
        extra_routers=live_routers(),
    )
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[None]:
        await host.start()
        monitor = asyncio.create_task(
            _sample(sampler, feed, plane.usage, clk, sample_interval_s), name="serve:monitor"
        )
        try:
            async with inner(a):
                yield
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
            await host.stop()

    app.router.lifespan_context = lifespan
    return LiveServer(app, master, plane, tenants, host, feed, sampler)


def ensure_admin_key(store: TenantStore, path: Path) -> bool:
    """Write a new admin key to ``path`` (mode 0600) unless the file exists.

    Returns:
        True when a key was created (first start).
    """
    if path.is_file():
        return False
    issued = store.create_admin_key(label="serve")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(issued.api_key + "\n")
    return True
