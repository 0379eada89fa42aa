"""The one list of the server's HTTP routers.

:func:`~joynexus.server.app.create_app` mounts :data:`CORE_ROUTERS` on every app;
``joynexus serve`` (:mod:`joynexus.server.serve`) adds :func:`live_routers` over its
Master, and the published OpenAPI document (:mod:`joynexus.server.openapi`, the
committed ``docs/openapi.json``) is built from exactly the same two lists, so a route
cannot be served without being documented.
"""

from __future__ import annotations

from fastapi import APIRouter

from joynexus.server.routes import env, futures, health, queue, scheduler, tenants

__all__ = ["CORE_ROUTERS", "live_routers"]

#: Health, tenants, futures, environment, Training Queue and Training Scheduler: the
#: routes that need no Master.
CORE_ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    tenants.router,
    futures.router,
    env.router,
    queue.router,
    scheduler.router,
)


def live_routers() -> tuple[APIRouter, ...]:
    """The routers a server over a live Master adds: workloads, model primitives,
    metrics, dashboard, admin engines and the openpi websocket."""
    # Imported here: the workload specs name the policy families, which import torch,
    # and the plain HTTP app (create_app) must not.
    from joynexus.server.openpi import router as openpi
    from joynexus.server.routes import dashboard, engines, metrics, models, workloads

    return (
        workloads.router,
        models.router,
        metrics.router,
        dashboard.router,
        engines.router,
        openpi,
    )
