"""Slow connections cannot hold the server (issue 28 item 5): a real uvicorn server
with ``joynexus serve``'s connection options on 127.0.0.1. Nothing asserts a duration:
the tests wait for the server to close a socket (or for a count), with a generous
timeout that only bounds a failing run."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import uvicorn

from joynexus.control.scheduler import TrainingScheduler
from joynexus.queues.training import TrainingQueue
from joynexus.server import ServiceRegistry, TenantStore, create_app
from joynexus.server.connections import ConnectionLimits, RateLimitedLog, uvicorn_options
from joynexus.services.environment import EnvironmentService

WAIT_S = 30.0  # bounds a failing run only


@contextmanager
def serving(limits: ConnectionLimits) -> Iterator[tuple[uvicorn.Server, int]]:
    app = create_app(
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
