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
"""

from __future__ import annotations

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


def _response(error: PayloadTooLargeError) -> JSONResponse:
    return JSONResponse(error.to_dict(), status_code=error.http_status)


@dataclass
class BodyLimits:
    """Which limit applies to which request.

    Args:
        bulk_bytes: Limit of routes that read tensors (``ServerConfig.max_body_bytes``).
        control_bytes: Limit of every other route (``ServerConfig.max_json_body_bytes``).
    """

    bulk_bytes: int
    control_bytes: int
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
        await _Limited(self.app, limit, setting)(scope, receive, send)


class _Limited:
    """One request's app call, refusing a body above ``limit`` bytes."""

    def __init__(self, app: ASGIApp, limit: int, setting: str) -> None:
        self.app = app
        self.limit = limit
        self.setting = setting

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _response(too_large(self.limit, self.setting, int(value)))(
                    scope, receive, send
                )
                return
        received = 0
        exceeded = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    exceeded = True
                    raise too_large(self.limit, self.setting)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:  # whatever the route made of the failed read: answer the 413
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await _response(too_large(self.limit, self.setting))(scope, receive, send)
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
            await _response(too_large(self.limit, self.setting))(scope, receive, send)
