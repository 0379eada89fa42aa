"""Request-body limits on every route, with or without a ``Content-Length``.

:class:`BodyLimitMiddleware` sits in front of every route of the application:

* a declared ``Content-Length`` above the route's limit is refused before a byte of
  the body is read;
* a body without one (``Transfer-Encoding: chunked``) is counted as it is read, and
  the read fails as soon as it passes the limit.

Either way the answer is 413 ``payload_too_large`` with the limit in the message and
in ``details.limit_bytes``, whatever the route does with the failed read (FastAPI's
own body parsing would turn it into a 400). Routes that carry tensors (their OpenAPI
request body comes from :func:`~joynexus.server.wire.tensor_body`) get the bulk limit,
every other route the (much smaller) control-message limit.

Ordinary HTTP clients (``requests``, ``httpx``, curl without ``Expect: 100-continue``)
send the whole body before they read the answer: a server that answers and closes
while they still send leaves them with a reset connection instead of the 413. So the
rest of a refused body is read and discarded first, up to ``drain_bytes`` more bytes
within ``drain_timeout_s``; past either, the 413 goes out with ``Connection: close``
and the connection ends (a client that sends gigabytes gets no free ride). A client
that asked ``Expect: 100-continue`` has not sent the body: it gets the 413 at once
(reading would make the server invite the body it refuses).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from joynexus.errors import PayloadTooLargeError

__all__ = ["BodyLimitMiddleware", "BodyLimits", "too_large"]


def too_large(limit: int, setting: str, declared: int | None = None) -> PayloadTooLargeError:
    """The 413 of a body above ``limit`` bytes (``setting`` names the server option)."""
    size = f"request body of {declared} bytes" if declared is not None else "request body"
    return PayloadTooLargeError(
        f"{size} exceeds the limit of {limit} bytes of this route (server setting {setting})",
        limit_bytes=limit,
        setting=setting,
    )


async def _drain(receive: Receive, budget: int, timeout_s: float) -> bool:
    """Read and discard the rest of the request body; True when it all arrived within
    ``budget`` bytes and ``timeout_s`` (the connection can then stay open)."""
    read = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return False  # the client went away
                read += len(message.get("body", b""))
                if read > budget:
                    return False
                if not message.get("more_body", False):
                    return True
    except TimeoutError:
        return False


async def _refuse(
    error: PayloadTooLargeError,
    limits: BodyLimits,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    body_done: bool = False,
) -> None:
    """Answer the 413 so that the client can read it (see the module docstring)."""
    expects = any(
        name == b"expect" and value.lower() == b"100-continue"
        for name, value in scope.get("headers", ())
    )
    drained = (
        body_done or expects or await _drain(receive, limits.drain_bytes, limits.drain_timeout_s)
    )
    headers = None if drained else {"connection": "close"}
    await JSONResponse(error.to_dict(), status_code=error.http_status, headers=headers)(
        scope, receive, send
    )


@dataclass
class BodyLimits:
    """Which limit applies to which request.

    Args:
        bulk_bytes: Limit of routes that read tensors (``ServerConfig.max_body_bytes``).
        control_bytes: Limit of every other route (``ServerConfig.max_json_body_bytes``).
        drain_bytes: Most bytes of a refused body read and discarded so the client can
            read the 413 (``ServerConfig.max_drain_bytes``).
        drain_timeout_s: Longest time spent discarding one refused body.
    """

    bulk_bytes: int
    control_bytes: int
    drain_bytes: int = 128 << 20
    drain_timeout_s: float = 30.0
    _bulk: list[tuple[frozenset[str], re.Pattern[str]]] = field(default_factory=list)

    def add_routers(self, routers: Iterable[APIRouter]) -> None:
        """Give the tensor routes of ``routers`` the bulk limit."""
        for router in routers:
            for route in router.routes:
                if isinstance(route, APIRoute) and _carries_tensors(route):
                    self._bulk.append((frozenset(route.methods or ()), route.path_regex))

    def of(self, method: str, path: str) -> tuple[int, str]:
        """The limit of a request and the name of its setting."""
        for methods, regex in self._bulk:
            if method in methods and regex.match(path):
                return self.bulk_bytes, "max_body_bytes"
        return self.control_bytes, "max_json_body_bytes"


def _carries_tensors(route: APIRoute) -> bool:
    extra: dict[str, Any] = route.openapi_extra or {}
    return "requestBody" in extra


class BodyLimitMiddleware:
    """ASGI middleware: refuses request bodies above their route's limit (see module)."""

    def __init__(self, app: ASGIApp, limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        limit, setting = self.limits.of(scope.get("method", ""), path)
        await _Limited(self.app, limit, setting, self.limits)(scope, receive, send)


class _Limited:
    """One request's app call, refusing a body above ``limit`` bytes."""

    def __init__(self, app: ASGIApp, limit: int, setting: str, limits: BodyLimits) -> None:
        self.app = app
        self.limit = limit
        self.setting = setting
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                error = too_large(self.limit, self.setting, int(value))
                await _refuse(error, self.limits, scope, receive, send)
                return
        received = 0
        exceeded = False
        started = False
        body_done = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded, body_done
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.limit:
                    exceeded = True
                    raise too_large(self.limit, self.setting)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:  # whatever the route made of the failed read: answer the 413
                if message["type"] == "http.response.start" and not started:
                    started = True
                    error = too_large(self.limit, self.setting)
                    await _refuse(error, self.limits, scope, receive, send, body_done=body_done)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not exceeded or started:
                raise
            started = True
            error = too_large(self.limit, self.setting)
            await _refuse(error, self.limits, scope, receive, send, body_done=body_done)
