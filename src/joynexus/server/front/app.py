"""The HTTP app of a front process.

* ``POST /v1/models/{tenant_id}/predict``: read the body, decode it (msgpack or JSON),
  validate it into the route's own :class:`~joynexus.server.routes.models.PredictIn`
  and bound its size, then hand the observation to the model process
  (:class:`HubClient`) and encode its answer as the client's ``Accept`` asks. A body
  this fast path refuses (malformed, too large, no ``Content-Length``, a bad path
  name) is forwarded unchanged to the model process's loopback server instead, so the
  client gets exactly today's answer, in today's order (a bad key is a 401 even when
  the body is bad too).
* everything else (control routes, long polls, the dashboard, ``/metrics``) is
  forwarded unchanged to the loopback server, streamed both ways;
* ``/v1/openpi`` (websocket), and ``/`` of the openpi port (:func:`front_openpi_app`,
  when the server has ``--openpi-port``): the handshake and metadata come from the model process's
  gateway over an upstream connection, the request frames are decoded, validated and
  answered here (:mod:`.openpi`), the observations reaching the model process through
  the same slots as a predict's.

When the model process cannot be reached the answer is 503 ``service_unavailable``;
a front whose hub connection is gone stops (its supervisor starts a new one).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
from fastapi import FastAPI, Request, Response, WebSocket
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Scope

from joynexus.errors import JoyNexusError, ServiceUnavailableError
from joynexus.models.batch import ObservationBatch
from joynexus.server.accesslog import install_access_log_redaction
from joynexus.server.app import install_request_ids
from joynexus.server.config import ServerConfig
from joynexus.server.errors import REQUEST_ID_HEADER, install_error_handlers, request_id
from joynexus.server.front.channel import SlotRing, encode_frame, read_frame
from joynexus.server.front.openpi import connect_upstream, decode_websocket
from joynexus.server.names import PathName
from joynexus.server.openpi.app import PATH as OPENPI_PATH
from joynexus.server.openpi.app import openpi_port_app
from joynexus.server.routes.models import PredictIn, PredictOut, check_predict_size
from joynexus.server.wire import decode_bytes, respond_fields

__all__ = [
    "HubClient",
    "decode_predict",
    "front_app",
    "front_openpi_app",
    "tensors_of",
    "upstream_target",
]

_PATH_NAME: TypeAdapter[str] = TypeAdapter(PathName)
#: Connection-level headers a proxy must not pass on (RFC 9110 §7.6.1).
_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
}
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


class _AnyPath(PathConvertor):
    """Starlette's ``path`` convertor, newlines included (its ``.*`` stops at one): a
    decoded ``%0A`` must reach the forwarding route, not the front's own 404."""

    regex = "(?s:.*)"


register_url_convertor("any_path", _AnyPath())


class HubClient:
    """This front's connection to the model process's hub (one, multiplexed)."""

    def __init__(self, path: str, index: int, ring: SlotRing | None) -> None:
        self.path = path
        self.index = index
        self.ring = ring
        self.on_lost: Callable[[], None] = lambda: None
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[tuple[Any, ...]]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._encode_s = 0.0
        self._encode_n = 0

    async def connect(self) -> None:
        reader, self._writer = await asyncio.open_unix_connection(self.path)
        self._writer.write(encode_frame(("hello", self.index)))
        self._reader_task = asyncio.create_task(self._read(reader))

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                reply = await read_frame(reader)
                future = self._pending.pop(int(reply[1]), None)
                if future is not None and not future.done():
                    future.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            gone = ServiceUnavailableError(
                "the model process went away while answering; retry", service="model"
            )
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(gone)
            self._pending.clear()
            self.on_lost()

    def encoded(self, seconds: float) -> None:
        """Seconds this front spent encoding an answer (reported with the next request)."""
        self._encode_s += seconds
        self._encode_n += 1

    async def predict(
        self, request: Request, tenant: str, body: PredictIn, read_s: float, decode_s: float
    ) -> tuple[Any, ...]:
        """The hub's reply to one decoded predict: ``("ok", id, result)`` or
        ``("error", id, status, body, headers)``."""
        obs = body.observations
        rest = {
            "instructions": obs.instructions,
            "policy_version": body.policy_version,
            "mode": body.mode,
            "read_s": read_s,
            "decode_s": decode_s,
            "encode_s": self._encode_s,
            "encode_n": self._encode_n,
        }
        self._encode_s, self._encode_n = 0.0, 0
        fields = (
            request.url.path,
            tenant,
            request.headers.get("authorization"),
            request_id(request),
            rest,
        )
        return await self.request("predict", tensors_of(obs), fields)

    async def openpi(
        self, tenant_id: str, version: int | None, obs: ObservationBatch, decode_s: float
    ) -> tuple[np.ndarray, int]:
        """One openpi observation decoded in this front, answered by the model process.

        Raises:
            JoyNexusError: the error text the robot gets (the gateway's own text).
        """
        fields = (tenant_id, version, obs.instructions, decode_s)
        reply = await self.request("openpi", tensors_of(obs), fields)
        if reply[0] != "ok":
            raise JoyNexusError(str(reply[2]))
        actions, served = reply[2]
        return actions, int(served)

    async def request(
        self, kind: str, arrays: dict[str, np.ndarray], fields: tuple[Any, ...]
    ) -> tuple[Any, ...]:
        """Send ``(kind, id, fields, slot refs, inline arrays)``; the hub's reply."""
        if self._writer is None or self._writer.is_closing():
            raise ServiceUnavailableError("the model process is not reachable", service="model")
        placed = None if self.ring is None else self.ring.put(arrays)
        req_id = next(self._ids)
        message = (
            kind,
            req_id,
            fields,
            None if placed is None else placed[1],
            arrays if placed is None else None,
        )
        future: asyncio.Future[tuple[Any, ...]] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = future
        try:
            self._writer.write(encode_frame(message))
            return await future
        finally:
            self._pending.pop(req_id, None)
            if placed is not None and self.ring is not None:
                self.ring.release(placed[0])


def decode_predict(raw: bytes, content_type: str | None, config: ServerConfig) -> PredictIn:
    """A predict body decoded, validated and bounded as the model process's route would.

    Raises:
        JoyNexusError, RequestValidationError, ValidationError: what the route answers.
    """
    body = decode_bytes(raw, content_type, PredictIn, max_tensor_bytes=config.max_tensor_bytes)
    check_predict_size(config, body.observations)
    body.observations.check_finite()  # as the route's batch() does
    return body


def tensors_of(obs: Any) -> dict[str, np.ndarray]:
    """An observation's arrays by channel name (cameras as ``cam:<name>``)."""
    arrays = {f"cam:{name}": arr for name, arr in obs.cameras.items()}
    arrays["state"] = obs.state
    if obs.actions is not None:
        arrays["actions"] = obs.actions
    return arrays


def front_app(
    config: ServerConfig, hub: HubClient, loopback: str, front_token: str = ""
) -> FastAPI:
    """The app one front process serves on the public port (``front_token``: what the
    openpi gateway knows this server's fronts by; without it, openpi is relayed)."""
    client = httpx.AsyncClient(
        base_url=loopback,
        timeout=httpx.Timeout(None, connect=10.0),  # long polls wait as long as they wait
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    install_error_handlers(app)
    install_request_ids(app)
    install_access_log_redaction()

    async def forward(request: Request, body: bytes | None = None) -> Response:
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _HOP]
        headers = [(k, v) for k, v in headers if k.lower() != REQUEST_ID_HEADER.lower().encode()]
        headers.append((REQUEST_ID_HEADER.encode(), request_id(request).encode()))
        upstream = client.build_request(
            request.method,
            upstream_target(request.scope),
            headers=headers,
            content=_content(request) if body is None else body,
        )
        try:
            answer = await client.send(upstream, stream=True)
        except ClientDisconnect:  # the client left while its body was being forwarded
            return Response(status_code=400)
        except httpx.TransportError:
            raise ServiceUnavailableError(
                "the model process is not answering; retry", service="model"
            ) from None
        out = StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            background=BackgroundTask(answer.aclose),
        )
        out.raw_headers = [(k, v) for k, v in answer.headers.raw if k.lower() not in _HOP]
        return out

    @app.post("/v1/models/{tenant_id}/predict")
    async def predict(tenant_id: str, request: Request) -> Response:
        started = time.perf_counter()
        declared = request.headers.get("content-length", "")
        if not declared.isdigit() or int(declared) > config.max_body_bytes:
            return await forward(request)  # the loopback's body limits answer it
        raw = await request.body()
        read = time.perf_counter()
        try:
            _PATH_NAME.validate_python(tenant_id)
            body = decode_predict(raw, request.headers.get("content-type"), config)
        except (JoyNexusError, RequestValidationError, ValidationError):
            return await forward(request, raw)  # today's answer, in today's order
        reply = await hub.predict(
            request, tenant_id, body, read - started, time.perf_counter() - read
        )
        if reply[0] == "error":
            _, _, status, content, headers = reply
            response = Response(content, status_code=status)
            response.raw_headers = [
                (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers
            ] + [(b"content-length", str(len(content)).encode())]
            return response
        encoding = time.perf_counter()
        response = respond_fields(request, PredictOut, reply[2])
        hub.encoded(time.perf_counter() - encoding)
        return response

    @app.websocket(OPENPI_PATH)
    async def openpi(websocket: WebSocket) -> None:
        await _openpi(websocket, loopback, hub, front_token)

    @app.api_route("/{path:any_path}", methods=_METHODS, include_in_schema=False)
    async def everything_else(request: Request) -> Response:
        return await forward(request)

    return app


def front_openpi_app(hub: HubClient, loopback: str, front_token: str = "") -> Starlette:
    """The app one front process serves on ``joynexus serve --openpi-port``: what the
    model process's :func:`~joynexus.server.openpi.app.openpi_app` serves there (the
    websocket at ``/``, ``GET /healthz``), the websocket decoded here as on the main
    port's ``/v1/openpi``, which its upstream connection names."""

    async def endpoint(websocket: WebSocket) -> None:
        await _openpi(websocket, loopback, hub, front_token, OPENPI_PATH)

    return openpi_port_app(endpoint)


async def _openpi(
    websocket: WebSocket, loopback: str, hub: HubClient, front_token: str, path: str | None = None
) -> None:
    """One openpi connection: decoded here with the gateway's front token, else relayed."""
    if front_token:
        await decode_websocket(websocket, loopback, hub, front_token, path)
    else:
        await relay_websocket(websocket, loopback, path)


#: Each byte of a request target as it travels upstream: visible ASCII as itself, every
#: other byte (controls, space, non-ASCII) and the delimiters ``?`` and ``#`` escaped.
_TARGET_BYTES = [
    chr(b) if 0x21 <= b <= 0x7E and b not in b"?#" else f"%{b:02X}" for b in range(256)
]


def upstream_target(scope: Scope) -> httpx.URL:
    """The request's path and query as the client sent them, still percent-encoded.

    The loopback server then decodes the path once, as the public port would have: the
    decoded path is never encoded again (``%2541`` stays ``%41``, not ``A``), and a
    control character the client escaped (``%0B``) stays escaped on the way, so the
    model process answers it as it answers any bad path.
    """
    raw = scope.get("raw_path") or quote(scope["path"]).encode()
    target = "".join([_TARGET_BYTES[b] for b in raw])
    query = scope.get("query_string") or b""
    if query:
        target += "?" + "".join([_TARGET_BYTES[b] if b != 0x3F else "?" for b in query])
    return httpx.URL(raw_path=target.encode("ascii"))


def _content(request: Request) -> Any:
    """The body to forward, streamed; none when the request declares none."""
    headers = request.headers
    if "content-length" in headers or "transfer-encoding" in headers:
        return request.stream()
    return None


async def relay_websocket(websocket: WebSocket, loopback: str, path: str | None = None) -> None:
    """Relay one websocket to ``path`` (default: its own) on the loopback server, both
    ways."""
    from websockets.exceptions import ConnectionClosed

    upstream = await connect_upstream(websocket, loopback, path=path)
    if upstream is None:
        return
    await websocket.accept()

    async def inbound() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            await upstream.send(data if data is not None else message.get("text") or "")

    async def outbound() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in upstream:
                if isinstance(data, bytes):
                    await websocket.send_bytes(data)
                else:
                    await websocket.send_text(data)
        close = upstream.close_code or 1000
        with contextlib.suppress(Exception):
            await websocket.close(code=close, reason=upstream.close_reason or "")

    tasks = [asyncio.create_task(inbound()), asyncio.create_task(outbound())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
