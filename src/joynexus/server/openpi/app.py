"""Where the openpi endpoint is mounted: its own port, and a path of the main port.

``joynexus serve --openpi-port PORT`` serves :func:`openpi_app` there: the websocket
at ``/`` (what ``WebsocketClientPolicy(host, PORT)`` connects to) and ``GET /healthz``
(200, as openpi's server answers it), nothing else. The same endpoint is also the
``/v1/openpi`` websocket route of the main app (``router``), for deployments that
expose one port: ``WebsocketClientPolicy("ws://host:8000/v1/openpi", api_key=...)``.
Both reach one :class:`~.gateway.OpenPIGateway` (the ``openpi`` service of the
registry), so the per-tenant connection bound counts both doors.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Sequence

import uvicorn
from fastapi import APIRouter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from joynexus.server.openpi.gateway import OpenPIGateway
from joynexus.server.state import ServerState

__all__ = ["OPENPI", "PATH", "openpi_app", "openpi_port_app", "router", "serve_together"]

#: Registry extra: the server's :class:`OpenPIGateway`.
OPENPI = "openpi"
#: The endpoint's path on the main port.
PATH = "/v1/openpi"

router = APIRouter(tags=["openpi"])


@router.websocket(PATH)
async def openpi_endpoint(websocket: WebSocket) -> None:
    """openpi's websocket policy protocol for the tenant of the ``Api-Key`` header."""
    state = websocket.app.state.joynexus
    assert isinstance(state, ServerState)
    gateway: OpenPIGateway = state.service(OPENPI)
    await gateway.serve(websocket, state)


def openpi_app(state: ServerState, gateway: OpenPIGateway) -> Starlette:
    """The app of the openpi port: the websocket at ``/`` and ``GET /healthz``."""

    async def endpoint(websocket: WebSocket) -> None:
        await gateway.serve(websocket, state)

    return openpi_port_app(endpoint)


def openpi_port_app(endpoint: Callable[[WebSocket], Awaitable[None]]) -> Starlette:
    """What the openpi port serves, with ``endpoint`` answering its websocket at ``/``
    (the model process's gateway, or a front process's decoder)."""

    async def healthz(_: Request) -> PlainTextResponse:
        return PlainTextResponse("OK\n")

    return Starlette(
        routes=[Route("/healthz", healthz, methods=["GET"]), WebSocketRoute("/", endpoint)]
    )


async def serve_together(
    *servers: uvicorn.Server, sockets: Sequence[list[socket.socket]] | None = None
) -> None:
    """Run uvicorn servers in one event loop until one of them stops, then stop all.

    Only one of them receives SIGINT / SIGTERM (each installs the handlers in turn, the
    last one wins); whichever stops first takes the others down with it.

    Args:
        sockets: Per server, the listening sockets it serves (default: it binds its own).
    """
    bound = sockets if sockets is not None else [None] * len(servers)
    tasks = [asyncio.create_task(s.serve(sockets=b)) for s, b in zip(servers, bound, strict=True)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
