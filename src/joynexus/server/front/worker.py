"""A front process: ``python -m joynexus.server.front.worker --fd N ...``.

Started by :class:`~joynexus.server.front.supervisor.FrontSupervisor` with the public
listening socket inherited as file descriptor ``--fd`` (every front accepts on the same
socket, the kernel hands each connection to one of them), the hub's socket path, its
index and shared-memory block, the loopback URL of the model process, the server's
configuration and its connection limits; with ``--openpi-fd``, the listening socket of
``joynexus serve --openpi-port`` too, which it serves as the model process would
(:func:`~joynexus.server.front.app.front_openpi_app`). It never imports torch.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from typing import Any

import uvicorn

from joynexus.server.config import ServerConfig
from joynexus.server.connections import ConnectionLimits, install_log_limits, uvicorn_options
from joynexus.server.front.app import HubClient, front_app, front_openpi_app
from joynexus.server.front.channel import FRONT_TOKEN_ENV, SlotRing, attach
from joynexus.server.openpi.app import serve_together

__all__ = ["main"]


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="joynexus-front", description=__doc__)
    p.add_argument("--fd", type=int, required=True, help="the public listening socket")
    p.add_argument("--openpi-fd", type=int, default=-1, help="the openpi port's socket")
    p.add_argument("--hub", required=True, help="the model process's hub socket path")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--shm", default="", help="this front's shared-memory block")
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--loopback", required=True, help="the model process's HTTP URL")
    p.add_argument("--config", required=True, help="ServerConfig as JSON")
    p.add_argument("--limits", required=True, help="ConnectionLimits as JSON")
    return p.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    config = ServerConfig.model_validate_json(args.config)
    limits = ConnectionLimits.model_validate_json(args.limits)
    ring = SlotRing(attach(args.shm), args.slots) if args.shm else None
    hub = HubClient(args.hub, args.index, ring)
    await hub.connect()
    install_log_limits(limits)
    token = os.environ.get(FRONT_TOKEN_ENV, "")
    apps: list[tuple[Any, int]] = [(front_app(config, hub, args.loopback, token), args.fd)]
    if args.openpi_fd >= 0:
        apps.append((front_openpi_app(hub, args.loopback, token), args.openpi_fd))
    servers = [
        uvicorn.Server(uvicorn.Config(app, log_level="info", **uvicorn_options(limits)))
        for app, _ in apps
    ]

    def lost() -> None:  # the model process is gone or restarting: stop, be replaced
        for server in servers:
            server.should_exit = True

    hub.on_lost = lost
    try:
        await serve_together(*servers, sockets=[[socket.socket(fileno=fd)] for _, fd in apps])
    finally:
        await hub.close()
        if ring is not None:
            ring.shm.close()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_serve(_args(argv)))


if __name__ == "__main__":
    main()
