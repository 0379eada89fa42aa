"""``joynexus serve``'s ports, tried before anything loads.

A second server on a taken port used to load its model, print "serving on ..." and
then die in uvicorn's bind with a traceback. Each port is bound here once (as the
server binds it: ``SO_REUSEADDR``, so a port left in ``TIME_WAIT`` still passes) and
released at once; a port that cannot be bound is one line naming the option to change.
"""

from __future__ import annotations

import errno
import socket

import typer
from rich.console import Console
from rich.markup import escape

from joynexus.errors import ConflictError

__all__ = ["check_ports", "exit_if_ports_taken"]


def _try_bind(host: str, port: int) -> OSError | None:
    """The error binding ``host:port`` raises, or ``None`` (the socket is closed again)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        if hasattr(socket, "SO_REUSEADDR") and family != getattr(socket, "AF_UNIX", None):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
            sock.listen(1)
        except OSError as exc:
            return exc
    return None


def check_ports(host: str, ports: dict[str, int | None]) -> None:
    """Bind each ``option: port`` on ``host`` once.

    Raises:
        ConflictError: a port is named twice, is in use, or cannot be bound here.
    """
    named = {option: port for option, port in ports.items() if port is not None}
    seen: dict[int, str] = {}
    for option, port in named.items():
        if port in seen and port != 0:
            raise ConflictError(
                f"{option} {port} is also {seen[port]}: give each its own port",
                field=option,
            )
        seen[port] = option
        error = _try_bind(host, port)
        if error is None:
            continue
        if isinstance(error, socket.gaierror):
            raise ConflictError(f"--host {host!r} is not an address of this machine ({error})")
        if error.errno == errno.EADDRINUSE:
            raise ConflictError(f"port {port} is in use: pick another with {option}", field=option)
        why = error.strerror or str(error)
        raise ConflictError(
            f"port {port} on {host} cannot be bound ({why}): pick another with {option} "
            "or another --host",
            field=option,
        )


def exit_if_ports_taken(host: str, port: int, openpi_port: int | None) -> None:
    """``serve``'s check: one ``error:`` line and exit 1 when a port cannot be bound.

    Raises:
        typer.Exit: code 1, after the line.
    """
    try:
        check_ports(host, {"--port": port, "--openpi-port": openpi_port})
    except ConflictError as exc:
        Console().print(
            f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True, emoji=False
        )
        raise typer.Exit(1) from None
