"""Slow connections cannot hold the server (issue 28 item 5), and websockets live as long
as their client answers pings (issue 43 item 1): a real uvicorn server with ``joynexus
serve``'s connection options on 127.0.0.1. Nothing asserts a duration: the tests wait
for the server to close a socket (or for a count), with a generous timeout that only
bounds a failing run; a websocket is held for several header timeouts before it is
used again."""

from __future__ import annotations

import base64
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.sync.client import connect

from joynexus.control.scheduler import TrainingScheduler
from joynexus.queues.training import TrainingQueue
from joynexus.server import ServiceRegistry, TenantStore, create_app
from joynexus.server.connections import (
    SPARE_FILES,
    ConnectionLimits,
    RateLimitedLog,
    raise_open_files_limit,
    uvicorn_options,
)
from joynexus.services.environment import EnvironmentService

WAIT_S = 30.0  # bounds a failing run only


async def _echo(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            await websocket.send_bytes(await websocket.receive_bytes())
    except WebSocketDisconnect:
        pass


#: A websocket echo at /ws: what a robot's connection does, without a model.
ECHO = Starlette(routes=[WebSocketRoute("/ws", _echo)])


@contextmanager
def serving(limits: ConnectionLimits, app: Any = None) -> Iterator[tuple[uvicorn.Server, int]]:
    app = app or create_app(
        services=ServiceRegistry(
            tenants=TenantStore.in_memory(),
            scheduler=TrainingScheduler.in_memory(),
            training_queue=TrainingQueue(),
            environment=EnvironmentService(),
        )
    )
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", **uvicorn_options(limits)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "uvicorn to start")
    try:
        yield server, server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=WAIT_S)


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def closed_by_server(sock: socket.socket) -> bool:
    """True when the server closed the connection (recv returns EOF)."""
    sock.settimeout(WAIT_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def get_healthz(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    sock.settimeout(WAIT_S)
    data = b""
    while b'"ok"' not in data:
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    return data


def test_a_connection_that_never_finishes_its_headers_is_closed() -> None:
    with serving(ConnectionLimits(header_timeout_s=0.2)) as (_, port):
        silent = socket.create_connection(("127.0.0.1", port))
        partial = socket.create_connection(("127.0.0.1", port))
        partial.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")  # no blank line
        assert closed_by_server(silent)
        assert closed_by_server(partial)
        # A well-behaved client is served, and again on the same kept-alive connection.
        with socket.create_connection(("127.0.0.1", port)) as ok:
            assert get_healthz(ok).startswith(b"HTTP/1.1 200")
            assert get_healthz(ok).startswith(b"HTTP/1.1 200")
        silent.close()
        partial.close()


def test_connections_beyond_the_cap_are_closed_at_once() -> None:
    with serving(ConnectionLimits(header_timeout_s=60, max_connections=2)) as (server, port):
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        wait_until(lambda: len(server.server_state.connections) == 2, "two connections")
        extra = socket.create_connection(("127.0.0.1", port))
        assert closed_by_server(extra)
        held.append(socket.create_connection(("127.0.0.1", port)))
        assert closed_by_server(held[-1])
        for s in [*held, extra]:
            s.close()
        wait_until(lambda: not server.server_state.connections, "connections to close")
        with socket.create_connection(("127.0.0.1", port)) as ok:  # room again
            assert get_healthz(ok).startswith(b"HTTP/1.1 200")


def test_a_storm_of_one_log_message_is_rate_limited() -> None:
    now = [0.0]
    log_filter = RateLimitedLog(burst=3, window_s=10.0, clock=lambda: now[0])
    logger = logging.getLogger("test.connections.storm")
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger.addFilter(log_filter)
    logger.addHandler(Keep())
    logger.propagate = False
    for _ in range(1000):
        logger.error("socket.accept() out of system resource: %s", "Too many open files")
    logger.error("another message")
    assert len(records) == 4  # 3 of the storm, and the other message
    now[0] = 10.0
    logger.error("socket.accept() out of system resource: %s", "Too many open files")
    assert records[-1].endswith("[997 more like this suppressed]"), records[-1]


def test_a_websocket_outlives_the_header_timeout() -> None:
    """The robot path: a connection upgraded to a websocket is not cut at
    header_timeout_s (it was, at 10 s by default, with no request in progress)."""
    limits = ConnectionLimits(header_timeout_s=0.2, ws_ping_interval_s=0.1, ws_missed_pings=5)
    with serving(limits, ECHO) as (_, port), connect(f"ws://127.0.0.1:{port}/ws") as ws:
        ws.send(b"first")
        assert ws.recv(timeout=WAIT_S) == b"first"
        time.sleep(limits.header_timeout_s * 5)  # held idle, pings answered meanwhile
        ws.send(b"again")
        assert ws.recv(timeout=WAIT_S) == b"again"


def _upgrade(port: int) -> socket.socket:
    """A websocket opened by hand that will never answer a ping (a frozen client)."""
    sock = socket.create_connection(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    sock.settimeout(WAIT_S)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (pings, close frame)."""
    sock.settimeout(WAIT_S)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_a_websocket_that_misses_its_pings_is_closed_and_frees_its_slot() -> None:
    limits = ConnectionLimits(
        header_timeout_s=60, max_connections=2, ws_ping_interval_s=0.1, ws_missed_pings=2
    )
    with serving(limits, ECHO) as (server, port):
        frozen = _upgrade(port)
        sent = _read_until_closed(frozen)
        assert sent[:1] == b"\x89", sent[:8]  # a ping frame came first
        assert b"\x88" in sent  # then a close frame (1011 keepalive ping timeout)
        frozen.close()
        wait_until(lambda: not server.server_state.connections, "the slot to be freed")
        # A live client beside a frozen one: answered pings keep it open.
        frozen = _upgrade(port)
        with connect(f"ws://127.0.0.1:{port}/ws") as ws:
            assert _read_until_closed(frozen)
            ws.send(b"still here")
            assert ws.recv(timeout=WAIT_S) == b"still here"
        frozen.close()


def test_websockets_count_toward_the_connection_cap() -> None:
    limits = ConnectionLimits(header_timeout_s=60, max_connections=1, ws_ping_interval_s=5)
    with serving(limits, ECHO) as (server, port), connect(f"ws://127.0.0.1:{port}/ws") as ws:
        wait_until(lambda: len(server.server_state.connections) == 1, "one connection")
        extra = socket.create_connection(("127.0.0.1", port))
        assert closed_by_server(extra)
        extra.close()
        ws.send(b"ok")
        assert ws.recv(timeout=WAIT_S) == b"ok"


def test_uvicorn_options_carry_the_websocket_keepalive() -> None:
    options = uvicorn_options(ConnectionLimits(ws_ping_interval_s=20, ws_missed_pings=3))
    assert options["ws_ping_interval"] == 20
    assert options["ws_ping_timeout"] == 60


@pytest.mark.parametrize(
    ("soft", "hard", "expected"),
    [
        (1024, 20_000, 512 * 3 + SPARE_FILES),  # raised to what the caps need
        (1024, 1500, 1500),  # only up to the hard limit: the caller warns
        (65_536, 65_536, 65_536),  # already enough: left alone
    ],
)
def test_the_open_files_limit_is_raised_to_fit_every_ports_cap(
    monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, expected: int
) -> None:
    import resource

    limits = {"now": (soft, hard)}
    monkeypatch.setattr(resource, "getrlimit", lambda _: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda _, value: limits.update(now=value))
    got, need = raise_open_files_limit(ConnectionLimits(max_connections=512), ports=3)
    assert need == 512 * 3 + SPARE_FILES
    assert got == expected == limits["now"][0]
    assert limits["now"][1] == hard
