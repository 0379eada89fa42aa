"""A live server: the execution plane, the Master Service and the HTTP app around them.

:func:`build_plane` (from :mod:`joynexus.runtime.plane`, the one builder the runtimes
use too) loads the resident base model and builds the long-lived services (durable
Training Scheduler in the run directory, Training Queue, Environment / Training /
Inference Model Services) exactly once; :func:`build_live_app` wraps them in a
:class:`~joynexus.master.service.MasterService` and the FastAPI app with the workload
and model routers, starting the services and the Master's shared loops in the app's
lifespan (inside the server's event loop) and stopping them at shutdown.

Monitoring: the plane owns one :class:`~joynexus.metrics.MetricsService` (Prometheus
registry behind ``/metrics``, with the usage meter's counters) and one
:class:`~joynexus.metrics.UsageMeter` persisted to ``<run_dir>/usage.json`` (resumed
by a restarted server), both handed to the services. The live app adds a
:class:`~joynexus.metrics.control.ControlSampler` and the dashboard's
:class:`~joynexus.server.dashboard.DashboardFeed`, sampled by one lifespan task.

Health: given a :class:`~joynexus.runtime.health.HealthManager`, the server registers
its ``environment`` role (crashed sessions recreated for the workload that owns them)
and, for in-process inference, its ``inference`` role (:func:`watch_serving_roles`),
and runs the manager as a lifespan task; the dashboard shows its roles and events.

Unlike :mod:`joynexus.server.app`, this module imports torch: it is what
``joynexus serve`` and the end-to-end tests run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from joynexus.master.service import MasterService
from joynexus.master.limits import MasterLimits
from joynexus.errors import ServiceUnavailableError
from joynexus.metrics.control import ControlSampler
from joynexus.metrics.usage import UsageMeter
from joynexus.runtime.plane import ExecutionPlane, build_plane
from joynexus.server.app import create_app
from joynexus.server.auth import TenantStore
from joynexus.server.config import ServerConfig
from joynexus.server.dashboard import DashboardFeed
from joynexus.server.routes import dashboard, models, workloads
from joynexus.server.routes import metrics as metrics_routes
from joynexus.server.routes.metrics import MetricsAuth
from joynexus.server.state import ServiceRegistry
from joynexus.services.inference import InferenceModelService
from joynexus.utils.clock import Clock, SystemClock

if TYPE_CHECKING:
    from joynexus.runtime.health import HealthManager
    from joynexus.runtime.sessions import SessionRecovery

__all__ = [
    "ExecutionPlane",
    "LiveServer",
    "build_live_app",
    "build_plane",
    "ensure_admin_key",
    "watch_serving_roles",
]

MASTER = "master"
INFERENCE_ROLE = "inference"

log = logging.getLogger(__name__)


@dataclass
class LiveServer:
    app: FastAPI
    master: MasterService
    plane: ExecutionPlane
    tenants: TenantStore
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
    config: ServerConfig | None = None,
    limits: MasterLimits | None = None,
    clock: Clock | None = None,
    poll_s: float = 0.05,
    health: HealthManager | None = None,
    metrics_auth: MetricsAuth = "none",
    sample_interval_s: float = 1.0,
    dashboard_bucket_s: float = 5.0,
) -> LiveServer:
    """The HTTP app over ``plane`` with a Master Service; lifespan starts and stops both.

    Args:
        health: A Health Manager: the server registers its restartable roles with it
            (:func:`watch_serving_roles`), runs it in the lifespan, and the dashboard
            shows its roles and events (admins).
        metrics_auth: ``"none"``: ``/metrics`` answers without a key (scrapers);
            ``"admin"``: it needs an admin key.
        sample_interval_s: Period of the control-signal and usage sampling.
        dashboard_bucket_s: Width of a bucket of the dashboard's utilization timeline.
    """
    clk = clock or SystemClock()
    master = MasterService(
        base=plane.base,
        base_model_id=plane.base_model_id,
        scheduler=plane.scheduler,
        queue=plane.queue,
        env=plane.env,
        training=plane.training,
        inference=plane.inference,
        output_root=output_root,
        limits=limits,
        clock=clk,
        poll_s=poll_s,
    )
    feed = DashboardFeed(bucket_s=dashboard_bucket_s)
    sampler: ControlSampler | None = None
    extras: dict[str, Any] = {MASTER: master, metrics_routes.METRICS_AUTH: metrics_auth}
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
        watch_serving_roles(health, plane, master)
    services = ServiceRegistry(
        tenants=tenants,
        scheduler=plane.scheduler,
        training_queue=plane.queue,
        environment=plane.env,
        extras=extras,
    )
    app = create_app(
        config=config,
        services=services,
        clock=clk,
        extra_routers=(workloads.router, models.router, metrics_routes.router, dashboard.router),
    )
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[None]:
        if plane.metrics is not None:
            plane.metrics.start()
        await plane.inference.start()
        await master.start()
        background = [
            asyncio.create_task(
                _sample(sampler, feed, plane.usage, clk, sample_interval_s), name="serve:monitor"
            )
        ]
        if health is not None:
            background.append(asyncio.create_task(health.run(), name="serve:health"))
        try:
            async with inner(a):
                yield
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await master.aclose()
            await plane.inference.stop()
            await plane.env.aclose()
            if plane.metrics is not None:
                plane.metrics.stop()
            if plane.usage is not None:
                with contextlib.suppress(OSError):
                    plane.usage.save()

    app.router.lifespan_context = lifespan
    return LiveServer(app, master, plane, tenants, feed, sampler)


def watch_serving_roles(
    health: HealthManager, plane: ExecutionPlane, master: MasterService
) -> SessionRecovery:
    """Register the live server's restartable roles with ``health``.

    * ``environment``: a crashed session of a live workload is closed and recreated
      with the same spec, and its tenant's session id swapped
      (:class:`~joynexus.runtime.sessions.SessionRecovery`);
    * ``inference`` (in-process service only; a Ray actor's engine is not watched
      here): the Inference Queue worker must be running; a restart stops and starts it
      again (tenant slots and published weights live in the service and survive).
    """
    from joynexus.runtime.sessions import SessionRecovery

    sessions = SessionRecovery(plane.env, master.session_holders, health)
    sessions.register()

    async def probe_inference() -> None:
        if not plane.inference.inference_queue.running:
            raise ServiceUnavailableError("the inference queue worker stopped unexpectedly")

    async def restart_inference() -> None:
        await plane.inference.stop()
        await plane.inference.start()

    if isinstance(plane.inference, InferenceModelService):  # in process (not a Ray actor)
        health.register(INFERENCE_ROLE, restart_inference, probe=probe_inference)
    return sessions


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
