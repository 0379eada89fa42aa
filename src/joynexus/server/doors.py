"""Where ``joynexus serve`` listens: the live app on its main port and, with
``--openpi-port``, the openpi port, behind front processes or served by the model
process itself — every listener with the same connection limits.

One job: choose the serving mode and start the listeners. What the listeners guard
(header timeout, cap, websocket pings) is :mod:`joynexus.server.connections`; the
fronts are :mod:`joynexus.server.front.supervisor`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import uvicorn

from joynexus.server.connections import (
    ConnectionLimits,
    raise_open_files_limit,
    uvicorn_options,
)
from joynexus.server.openpi import OPENPI, openpi_app
from joynexus.server.openpi.app import serve_together

__all__ = ["openpi_line", "serve_doors"]


def openpi_line(host: str, openpi_port: int) -> str:
    """What ``serve`` prints about the openpi port."""
    return f"openpi websocket policy endpoint: ws://{host}:{openpi_port} (GET /healthz there)"


def serve_doors(
    app: Any,
    *,
    host: str,
    port: int,
    openpi_port: int | None,
    fronts: int,
    limits: ConnectionLimits,
    say: Callable[[str], None],
) -> None:
    """Serve the live ``app`` until it stops.

    Args:
        fronts: Front processes (0: the model process serves every listener itself).
        say: Where the lines for the operator go (the CLI's console).
    """
    # Each listener (the main port, --openpi-port, and in front mode the model
    # process's loopback behind them) holds up to max_connections descriptors.
    listeners = 2 + (openpi_port is not None)
    soft, need = raise_open_files_limit(limits, listeners)
    if soft < need:
        say(
            f"[yellow]warning:[/yellow] the open-files limit is {soft}; --max-connections "
            f"{limits.max_connections} on {listeners} listeners needs {need}: lower "
            "--max-connections or raise the hard limit (ulimit -Hn)"
        )
    options = uvicorn_options(limits)
    if fronts > 0:
        from joynexus.server.front.supervisor import serve_with_fronts

        doors = f"ports {port} and {openpi_port}" if openpi_port else f"port {port}"
        say(f"{fronts} front process(es) decode HTTP and websockets on {doors}")
        if openpi_port is not None:
            say(openpi_line(host, openpi_port))
        serve_with_fronts(
            app,
            host=host,
            port=port,
            fronts=fronts,
            options=options,
            limits=limits,
            openpi_port=openpi_port,
        )
    elif openpi_port is None:
        uvicorn.run(app, host=host, port=port, log_level="info", **options)
    else:
        # One event loop, one Master behind both ports; the openpi port's own app (the
        # websocket at / and GET /healthz) gets the main port's connection options.
        state = app.state.joynexus
        side = openpi_app(state, state.service(OPENPI))
        say(openpi_line(host, openpi_port))
        main = uvicorn.Config(app, host=host, port=port, log_level="info", **options)
        openpi = uvicorn.Config(
            side, host=host, port=openpi_port, log_level="info", lifespan="off", **options
        )
        asyncio.run(serve_together(uvicorn.Server(main), uvicorn.Server(openpi)))
