"""openpi's websocket policy protocol over the Master's ``predict`` (group-batched).

What a robot running ``openpi_client.WebsocketClientPolicy(host, port, api_key=KEY)``
sees, exactly as from openpi's own ``WebsocketPolicyServer``:

1. On connect, one binary frame: the metadata map (msgpack). Here it carries the
   tenant, the served policy version, the action chunk length (``action_horizon``) and
   action dimension, and the observation keys the tenant expects with their shapes.
2. Then strict request/response: each binary frame is a msgpack map of numpy values
   (openpi's ``msgpack_numpy`` encoding, :mod:`.codec`); each answer is one binary
   frame ``{"actions": float32 [H, D], "policy_timing": {...}, "server_timing": {...}}``.
3. An error is one text frame saying what went wrong (for a bad observation: every
   expected key and shape), then close code 1011 — what ``infer`` turns into a
   ``RuntimeError`` with that text.

Unlike openpi's server, which runs ``policy.infer`` inline in its event loop (one
request at a time for all connections), every request here is an ``await`` on the
Master's ``predict``: requests of all connections and all tenants meet in the Inference
Queue and share grouped backbone forwards, and a slow or dead connection holds only its
own coroutine. ``sequential=True`` is the openpi model, for ``joynexus bench robots``:
one lock around every predict of every connection.

Before the handshake (answered as an HTTP status with a text body, which the websocket
client raises as ``InvalidStatus``): the ``Authorization: Api-Key <key>`` header picks
the tenant (``Bearer <key>`` works too; 401 without a valid tenant key, 403 for an
admin key); a tenant without a served policy is 404; a pinned version that is not
served is 409; a tenant at its ``serving.openpi.max_connections`` is 429.

A connection pins a version with the query ``?policy_version=N`` (or ``=current``, the
version served when it connects): its requests are all answered by that version while
it is served (the latest, or held by an evaluation); without a pin each request gets
the latest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from joynexus.errors import (
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    JoyNexusError,
    PermissionDeniedError,
    QuotaExceededError,
)
from joynexus.server.openpi.codec import packb, unpackb
from joynexus.server.openpi.observations import ObservationAdapter

if TYPE_CHECKING:
    from joynexus.master.service import MasterService
    from joynexus.server.state import ServerState

__all__ = ["CLOSE_INTERNAL_ERROR", "OpenPIGateway"]

log = logging.getLogger(__name__)

#: The close code openpi's server sends after an error frame (RFC 6455 "internal error").
CLOSE_INTERNAL_ERROR = 1011
#: Largest request frame by default (uvicorn's own websocket message bound, 16 MiB, is
#: the same): two 224x224 RGB images take 0.3 MB.
DEFAULT_MAX_FRAME_BYTES = 16 << 20


@dataclass(frozen=True)
class _Connection:
    tenant_id: str
    version: int | None  # the pinned version; None: the latest at each request
    adapter: ObservationAdapter
    metadata: dict[str, Any]


class OpenPIGateway:
    """The openpi endpoint's shared state: open connections per tenant, and (in the
    sequential model only) the one lock every predict takes.

    Args:
        sequential: Answer one request at a time across all connections (openpi's
            server model; the bench's baseline).
        max_frame_bytes: Largest request frame; a larger one is an error frame.
    """

    def __init__(
        self, *, sequential: bool = False, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> None:
        self.sequential = sequential
        self.max_frame_bytes = max_frame_bytes
        self._open: dict[str, int] = {}
        self._lock = asyncio.Lock() if sequential else None

    def open_connections(self, tenant_id: str) -> int:
        return self._open.get(tenant_id, 0)

    async def serve(self, websocket: WebSocket, state: ServerState) -> None:
        """Run one connection to its end (the ASGI websocket endpoint's body)."""
        try:
            conn = self._admit(websocket, state)
        except JoyNexusError as exc:
            await _deny(websocket, exc)
            return
        limit = int(conn.metadata["max_connections"])
        if self.open_connections(conn.tenant_id) >= limit:
            await _deny(
                websocket,
                QuotaExceededError(
                    f"tenant {conn.tenant_id!r} already has {limit} open openpi connections "
                    "(serving.openpi.max_connections); close one or raise the limit",
                    reason="openpi_connections",
                ),
            )
            return
        self._open[conn.tenant_id] = self.open_connections(conn.tenant_id) + 1
        try:
            await websocket.accept()
            await websocket.send_bytes(packb(conn.metadata))
            await self._loop(websocket, state, conn)
        except (WebSocketDisconnect, OSError):
            pass  # the robot went away: only its own coroutine ends
        finally:
            self._open[conn.tenant_id] -= 1

    def _admit(self, websocket: WebSocket, state: ServerState) -> _Connection:
        tenant_id = _tenant_of(websocket, state)
        master = _master(state)
        tenant = master.require_slot(tenant_id)
        adapter = ObservationAdapter(tenant.schema, tenant.spec.serving.openpi)
        current = master.inference.current_policy_version(tenant_id)
        version = _pin(websocket.query_params.get("policy_version"), current)
        schema = tenant.schema
        metadata: dict[str, Any] = {
            "server": "joynexus",
            "tenant_id": tenant_id,
            "policy_version": current if version is None else version,
            "pinned": version is not None,
            "action_horizon": schema.action_chunk,
            "action_dim": schema.action_dim,
            "fps": schema.fps,
            "observation_keys": adapter.expected(),
            "max_connections": tenant.spec.serving.openpi.max_connections,
        }
        return _Connection(tenant_id, version, adapter, metadata)

    async def _loop(self, websocket: WebSocket, state: ServerState, conn: _Connection) -> None:
        prev_total_ms: float | None = None
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            started = time.monotonic()
            try:
                frame = message.get("bytes")
                if frame is None:
                    raise InvalidRequestError(
                        "expected a binary msgpack frame (an observation map), got a text frame"
                    )
                obs = conn.adapter.batch(unpackb(frame, max_bytes=self.max_frame_bytes))
                state.quotas.take_request(conn.tenant_id, state.quotas_of(conn.tenant_id))
                infer_start = time.monotonic()
                result = await self._predict(state, conn, obs)
                infer_ms = (time.monotonic() - infer_start) * 1000.0
            except JoyNexusError as exc:
                await _fail(websocket, exc.message)
                return
            except Exception:
                log.exception("openpi request of tenant %s failed", conn.tenant_id)
                await _fail(websocket, "internal error answering this request; see the server log")
                return
            server_timing: dict[str, float] = {"infer_ms": infer_ms}
            if prev_total_ms is not None:  # like openpi: the previous request's send included
                server_timing["prev_total_ms"] = prev_total_ms
            answer = {
                "actions": result.actions[0],
                "policy_version": int(result.policy_version),
                "policy_timing": {"infer_ms": infer_ms},
                "server_timing": server_timing,
            }
            await websocket.send_bytes(packb(answer))
            prev_total_ms = (time.monotonic() - started) * 1000.0

    async def _predict(self, state: ServerState, conn: _Connection, obs: Any) -> Any:
        master = _master(state)
        if self._lock is None:
            return await master.predict(conn.tenant_id, obs, conn.version, "mean")
        async with self._lock:
            return await master.predict(conn.tenant_id, obs, conn.version, "mean")


def _master(state: ServerState) -> MasterService:
    """The Master behind the tenant gateway (503 when this server has none)."""
    return state.gateway.master


def _tenant_of(websocket: WebSocket, state: ServerState) -> str:
    header = websocket.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() not in ("api-key", "bearer") or not key.strip():
        raise AuthenticationError(
            "missing API key: connect with WebsocketClientPolicy(host, port, api_key=<tenant "
            "key>), which sends 'Authorization: Api-Key <key>'"
        )
    principal = state.services.tenants.authenticate(key.strip())
    if principal is None:
        raise AuthenticationError("invalid or revoked API key")
    if principal.role != "tenant" or principal.tenant_id is None:
        raise PermissionDeniedError("the openpi endpoint serves a tenant; use a tenant's key")
    return principal.tenant_id


def _pin(raw: str | None, current: int) -> int | None:
    if raw is None or raw == "":
        return None
    if raw == "current":
        return current
    if not raw.isdigit() or len(raw) > 18:
        raise InvalidRequestError(
            f"policy_version={raw!r}: expected a version number or 'current'",
            field="policy_version",
        )
    version = int(raw)
    if version > current:
        raise ConflictError(
            f"policy_version={version} is not served yet (the latest is {current})",
            field="policy_version",
        )
    return version


async def _deny(websocket: WebSocket, exc: JoyNexusError) -> None:
    """Refuse the handshake with the error's HTTP status and its message as the body."""
    body = PlainTextResponse(f"{exc.code}: {exc.message}\n", status_code=exc.http_status)
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(body)
    else:  # a server without denial responses: a plain 403 close
        await websocket.close(code=1008, reason=exc.message[:120])


async def _fail(websocket: WebSocket, text: str) -> None:
    await websocket.send_text(text)
    await websocket.close(code=CLOSE_INTERNAL_ERROR, reason="error; see the previous frame")
