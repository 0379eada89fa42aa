"""The FastAPI application factory of the JoyNexus server.

``create_app`` wires injected services to routers, one per concern (health, tenants,
futures, environment, training queue, scheduler:
:data:`~joynexus.server.routers.CORE_ROUTERS`), installs the error handlers, a
request-id middleware and every route's request-body limit, and publishes the OpenAPI
document at ``/openapi.json``. The routers over a Master (model primitives, workloads;
:func:`~joynexus.server.routers.live_routers`) are passed as ``extra_routers`` and find
their services in ``ServiceRegistry.extras``.

This module never imports torch (the Training Queue instance it receives may).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from joynexus.server.accesslog import install_access_log_redaction
from joynexus.server.bodylimit import BodyLimitMiddleware, BodyLimits
from joynexus.server.config import ServerConfig
from joynexus.server.disk_quota import install_disk_quota
from joynexus.server.errors import (
    REQUEST_ID_HEADER,
    document_error_bodies,
    install_error_handlers,
)
from joynexus.server.futures import FutureRegistry
from joynexus.server.gateway import TenantGateway
from joynexus.server.ownership import PartitionOwnership
from joynexus.server.quotas import QuotaManager
from joynexus.server.routers import CORE_ROUTERS
from joynexus.server.state import ServerState, ServiceRegistry
from joynexus.server.wire import add_component_schemas
from joynexus.utils.clock import Clock, SystemClock

__all__ = ["API_VERSION", "create_app", "install_request_ids"]

API_VERSION = "v1"
_TITLE = "JoyNexus"
_DESCRIPTION = (
    "Multi-tenant post-training service for Vision-Language-Action models. Control "
    "messages are JSON; tensor payloads are msgpack (`application/msgpack`, arrays as "
    "extension type 42) or JSON tensors `{dtype, shape, data: base64}`. Every error body is "
    "`{code, message, details}`. Authenticate with `Authorization: Bearer <api key>`."
)


def create_app(
    *,
    config: ServerConfig | None = None,
    services: ServiceRegistry,
    clock: Clock | None = None,
    extra_routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """Build the HTTP application over ``services``.

    Args:
        config: Limits and defaults (quotas, body sizes, denied env kinds).
        services: The services the routes call; the app does not own their lifetime,
            except that pending futures are cancelled at shutdown.
        clock: Time source of rate limits, futures and long polls (tests: FakeClock).
        extra_routers: More routers to mount (they read ``app.state.joynexus``).
    """
    cfg = config or ServerConfig()
    clk: Clock = clock or SystemClock()
    quota_manager = QuotaManager(clk)
    future_registry = FutureRegistry(
        clk,
        quota_manager,
        retention_s=cfg.future_retention_s,
        read_retention_s=cfg.future_read_retention_s,
        max_per_tenant=cfg.max_futures_per_tenant,
    )
    partitions = PartitionOwnership(services.scheduler, services.training_queue)
    state = ServerState(
        config=cfg,
        services=services,
        clock=clk,
        quotas=quota_manager,
        futures=future_registry,
        gateway=TenantGateway(
            scheduler=services.scheduler,
            queue=services.training_queue,
            env=services.environment,
            futures=future_registry,
            partitions=partitions,
            master=services.master,
        ),
    )

    install_disk_quota(state)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await state.futures.aclose()

    app = FastAPI(
        title=_TITLE,
        version=API_VERSION,
        description=_DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs" if cfg.expose_docs else None,
        redoc_url=None,
    )
    app.state.joynexus = state
    install_error_handlers(app)
    install_access_log_redaction()  # a key in a URL's query never reaches the access log
    # Added before the request-id middleware, so it runs inside it (413s carry the id).
    body_limits = BodyLimits(
        bulk_bytes=cfg.max_body_bytes,
        control_bytes=cfg.max_json_body_bytes,
        drain_bytes=cfg.max_drain_bytes,
    )
    app.add_middleware(BodyLimitMiddleware, limits=body_limits)

    install_request_ids(app)

    routers = (*CORE_ROUTERS, *extra_routers)
    for router in routers:
        app.include_router(router)
    body_limits.add_routers(routers)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            add_component_schemas(document)
            document_error_bodies(document)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override
    return app


def install_request_ids(app: FastAPI) -> None:
    """Give every request an id (the client's ``X-Request-ID`` when it is a short
    alphanumeric one, else a new one), echoed in the response's header."""
    app.add_middleware(RequestIdMiddleware)


_REQUEST_ID_RAW = REQUEST_ID_HEADER.lower().encode("latin-1")


class RequestIdMiddleware:
    """ASGI middleware behind :func:`install_request_ids`.

    A plain ASGI layer rather than ``@app.middleware("http")``: Starlette's
    ``BaseHTTPMiddleware`` runs every request in a task group and streams its body and
    response through memory channels, a few hundred microseconds per ``predict``
    (RESULTS §8.1.4).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = ""
        for name, value in scope.get("headers", ()):
            if name == _REQUEST_ID_RAW:
                incoming = value.decode("latin-1")
                break
        rid = incoming if 0 < len(incoming) <= 64 and incoming.isalnum() else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault(REQUEST_ID_HEADER, rid)
            await send(message)

        await self.app(scope, receive, send_with_id)
