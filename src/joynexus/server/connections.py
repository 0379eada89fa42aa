"""Connection-level limits of ``joynexus serve``: slow or idle clients cannot hold the
server's file descriptors, and a storm of accept errors cannot flood the log.

uvicorn closes an idle keep-alive connection (``timeout_keep_alive``) and answers 503
above ``limit_concurrency``, but a connection that never completes its request headers
is held for ever: 400 half-open connections exhaust 1,024 file descriptors, after
which every ``accept`` fails and logs. :func:`guarded_protocol` adds to uvicorn's HTTP
protocol:

* a **header-read timeout**: a connection must complete each request's headers
  within ``header_timeout_s`` of its first byte (or of the connection opening), else
  it is closed — slowloris clients included, since dribbling bytes does not reset it;
* a **connection cap**: a connection accepted beyond ``max_connections`` is closed at
  once, releasing its descriptor before it can hold one.

The header timer ends where a request is upgraded to a websocket (an openpi robot
loop runs for minutes with no HTTP request in progress). From then on the connection
lives as long as its client answers pings: the server pings every
``ws_ping_interval_s`` and closes a websocket that has not answered a ping within
``ws_missed_pings`` intervals (a half-open or frozen client), through uvicorn's own
keepalive. The connection still counts toward the cap until it closes.

:class:`RateLimitedLog` keeps at most ``log_burst`` records of one message per
``log_window_s`` on the loggers accept errors go to, and says how many it dropped.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "LOG_LIMITED_LOGGERS",
    "ConnectionLimits",
    "RateLimitedLog",
    "guarded_protocol",
    "install_log_limits",
    "raise_open_files_limit",
    "uvicorn_options",
]

#: Loggers accept errors (``Too many open files``) and protocol errors are written to.
LOG_LIMITED_LOGGERS = ("asyncio", "uvicorn.error")


class ConnectionLimits(BaseModel):
    """Connection limits of ``joynexus serve`` (its ``--header-timeout``,
    ``--idle-timeout``, ``--max-connections``, ``--ws-ping-interval`` and
    ``--ws-missed-pings`` options), the same on every port it serves.

    Args:
        header_timeout_s: Longest time a connection may take to send a request's
            headers (from its first byte, or from the connection opening).
        idle_timeout_s: Longest idle time between requests on a keep-alive connection.
        max_connections: Open connections; one accepted beyond it is closed at once,
            and requests beyond it answer 503 (uvicorn's ``limit_concurrency``).
        ws_ping_interval_s: Seconds between the server's pings on an open websocket.
        ws_missed_pings: Ping intervals a websocket may leave a ping unanswered before
            it is closed (``ws_ping_interval_s * ws_missed_pings`` seconds).
        log_burst: Records of one message the limited loggers keep per window.
        log_window_s: The window of ``log_burst``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    header_timeout_s: float = Field(default=10.0, gt=0)
    idle_timeout_s: float = Field(default=5.0, gt=0)
    max_connections: int = Field(default=512, ge=1)
    ws_ping_interval_s: float = Field(default=20.0, gt=0)
    ws_missed_pings: int = Field(default=3, ge=1)
    log_burst: int = Field(default=10, ge=1)
    log_window_s: float = Field(default=10.0, gt=0)


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the header-read timeout and connection cap."""

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.close()  # connection_lost forgets it
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and not self._in_request():
                self._arm()  # the first byte of the next request starts its clock
            super().data_received(data)
            if self._in_request():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_websocket_upgrade(self, event: Any) -> None:
            # The websocket protocol takes the transport over; no request is ever "in
            # progress" again on it, so a timer left armed would cut a robot's loop at
            # header_timeout_s. Its liveness is the websocket's pings from here on.
            self._disarm()
            super().handle_websocket_upgrade(event)

        def _in_request(self) -> bool:
            # Headers complete: a request/response cycle is under way.
            return self.cycle is not None and not self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


def uvicorn_options(limits: ConnectionLimits) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.run`` / ``uvicorn.Config`` for ``limits``."""
    return {
        "http": guarded_protocol(limits),
        "timeout_keep_alive": limits.idle_timeout_s,
        "limit_concurrency": limits.max_connections,
        "ws_ping_interval": limits.ws_ping_interval_s,
        # uvicorn's websocket keepalive sends the next ping only once the last one was
        # answered: a pong overdue by this long is ws_missed_pings intervals of silence.
        "ws_ping_timeout": limits.ws_ping_interval_s * limits.ws_missed_pings,
    }


class RateLimitedLog(logging.Filter):
    """Keeps at most ``burst`` records of one message (logger and format string) per
    ``window_s``; the first record after a window that dropped some says how many.

    Args:
        burst: Records of one message kept per window.
        window_s: The window, in seconds of ``clock``.
        clock: Monotonic time source (tests pass a fake one).
    """

    def __init__(
        self, burst: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self.clock = clock
        # message key -> (window start, kept in this window, dropped since last kept)
        self._seen: dict[tuple[str, str], tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self.clock()
        start, kept, dropped = self._seen.get(key, (now, 0, 0))
        if now - start >= self.window_s:
            start, kept = now, 0
        if kept >= self.burst:
            self._seen[key] = (start, kept, dropped + 1)
            return False
        if dropped:
            record.msg = f"{record.msg} [{dropped} more like this suppressed]"
        self._seen[key] = (start, kept + 1, 0)
        if len(self._seen) > 10_000:  # many distinct messages: forget the oldest windows
            for k in sorted(self._seen, key=lambda k: self._seen[k][0])[:5_000]:
                del self._seen[k]
        return True


def install_log_limits(limits: ConnectionLimits) -> RateLimitedLog:
    """Attach one :class:`RateLimitedLog` to every logger of
    :data:`LOG_LIMITED_LOGGERS` (filters survive uvicorn's logging configuration)."""
    log_filter = RateLimitedLog(limits.log_burst, limits.log_window_s)
    for name in LOG_LIMITED_LOGGERS:
        logging.getLogger(name).addFilter(log_filter)
    return log_filter


#: Descriptors a server needs besides its connections (databases, logs, simulators'
#: pipes, shared memory, the fronts' hub sockets).
SPARE_FILES = 256


def raise_open_files_limit(limits: ConnectionLimits, ports: int) -> tuple[int, int]:
    """Raise this process's soft open-files limit (inherited by the fronts and
    simulators it starts) so that every port's full cap of connections fits beside
    :data:`SPARE_FILES`, up to the hard limit.

    Returns:
        (the soft limit now, the descriptors the caps need): a soft limit below the need
        means a full server could still run out of descriptors (the caller says so).
    """
    need = limits.max_connections * ports + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft, need
