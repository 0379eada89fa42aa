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

At the handshake (a refusal is a close frame right after it whose code is 4000 + the
HTTP status and whose reason is the message, :mod:`.refusal`, so the client's exception
says why): the ``Authorization: Api-Key <key>`` header picks the tenant (``Bearer
<key>`` works too; 401 without a valid tenant key, 403 for an admin key); a tenant
without a served policy is 404; a pinned version that is not served is 409; a tenant at
its ``serving.openpi.max_connections`` is 429.

A connection pins a version with the query ``?policy_version=N`` (or ``=current``, the
version served when it connects): its requests are all answered by that version while
it is served (the latest, or held by an evaluation); without a pin each request gets
the latest.

Behind front processes (``serve --front-procs N``) the front decodes and validates the
frames itself (:func:`answer_frames`, the same function this gateway's own loop runs):
it opens the connection here with the server's front token in :data:`FRONT_HEADER`, so
the handshake, its refusals, the connection bound and the metadata frame stay this
gateway's; a front connection then gets one more frame, the connection's description
(:func:`describe`, what the front needs to decode and to ask the hub for predictions),
and is held open until the robot leaves. The predict-stage meter counts frames decoded
here as ``openpi_decode`` and frames decoded in a front as ``openpi_decode_front``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from joynexus.errors import (
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    JoyNexusError,
    PermissionDeniedError,
    QuotaExceededError,
)
from joynexus.models.batch import ObservationBatch
from joynexus.models.schema import DataSchema
from joynexus.server.openpi.codec import packb, unpackb
from joynexus.server.openpi.observations import ObservationAdapter
from joynexus.server.openpi.refusal import refuse

if TYPE_CHECKING:
    from joynexus.master.primitives import ModelPrimitives
    from joynexus.server.state import ServerState
    from joynexus.spec.serving import OpenPIServing

__all__ = [
    "CLOSE_INTERNAL_ERROR",
    "FRONT_HEADER",
    "INTERNAL_ERROR_TEXT",
    "Described",
    "OpenPIGateway",
    "answer_frames",
    "describe",
    "described",
    "fail",
]

log = logging.getLogger(__name__)

#: The close code openpi's server sends after an error frame (RFC 6455 "internal error").
CLOSE_INTERNAL_ERROR = 1011
#: Largest request frame by default (uvicorn's own websocket message bound, 16 MiB, is
#: the same): two 224x224 RGB images take 0.3 MB.
DEFAULT_MAX_FRAME_BYTES = 16 << 20
#: The header a front process opens its upstream connection with (the front token).
FRONT_HEADER = "x-joynexus-front"
#: The error frame of a request that failed for a reason of ours (details in the log).
INTERNAL_ERROR_TEXT = "internal error answering this request; see the server log"
#: Answers one decoded observation: (actions [H, D], the policy version that answered).
Infer = Callable[[ObservationBatch], Awaitable[tuple[np.ndarray, int]]]


@dataclass(frozen=True)
class _Connection:
    tenant_id: str
    version: int | None  # the pinned version; None: the latest at each request
    adapter: ObservationAdapter
    metadata: dict[str, Any]


@dataclass(frozen=True)
class Described:
    """What a front knows of one connection (:func:`described` of :func:`describe`)."""

    tenant_id: str
    version: int | None
    adapter: ObservationAdapter
    max_frame_bytes: int


def describe(conn: _Connection, max_frame_bytes: int) -> dict[str, Any]:
    """The description frame's map (plain values: it is packed like any frame)."""
    return {
        "tenant_id": conn.tenant_id,
        "version": conn.version,
        "schema": conn.adapter.schema.model_dump(mode="json"),
        "camera_keys": conn.adapter.camera_keys,
        "state_keys": conn.adapter.state_keys,
        "prompt_key": conn.adapter.prompt_key,
        "max_frame_bytes": max_frame_bytes,
    }


def described(frame: bytes) -> Described:
    """The front's side of :func:`describe`."""
    d = unpackb(frame, max_bytes=DEFAULT_MAX_FRAME_BYTES)
    adapter = ObservationAdapter.of_keys(
        DataSchema.model_validate(d["schema"]), d["camera_keys"], d["state_keys"], d["prompt_key"]
    )
    version = d["version"]
    return Described(
        d["tenant_id"], None if version is None else int(version), adapter, d["max_frame_bytes"]
    )


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
        #: The token front processes connect with (set when the server has fronts).
        self.front_token: str | None = None

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
            if self._from_front(websocket):
                await websocket.send_bytes(packb(describe(conn, self.max_frame_bytes)))
                while (await websocket.receive())["type"] != "websocket.disconnect":
                    pass  # held: the front decodes; this connection counts toward the bound
                return
            await answer_frames(
                websocket,
                conn.adapter,
                self.max_frame_bytes,
                lambda obs: self.infer(state, conn.tenant_id, conn.version, obs),
                lambda seconds: _meter(state, "openpi_decode", seconds),
                conn.tenant_id,
            )
        except (WebSocketDisconnect, OSError):
            pass  # the robot went away: only its own coroutine ends
        finally:
            self._open[conn.tenant_id] -= 1

    def _admit(self, websocket: WebSocket, state: ServerState) -> _Connection:
        tenant_id = _tenant_of(websocket, state)
        slots = _primitives(state)
        tenant = slots.require_slot(tenant_id)
        options: OpenPIServing = tenant.spec.serving.openpi
        adapter = ObservationAdapter(tenant.schema, options)
        current = slots.served_version(tenant_id)
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

    def _from_front(self, websocket: WebSocket) -> bool:
        given = websocket.headers.get(FRONT_HEADER)
        token = self.front_token
        return token is not None and given is not None and hmac.compare_digest(given, token)

    async def infer(
        self, state: ServerState, tenant_id: str, version: int | None, obs: ObservationBatch
    ) -> tuple[np.ndarray, int]:
        """One decoded observation's answer: the rate-limit token, then the Master's
        ``predict`` (under the one lock in the sequential model)."""
        state.quotas.take_request(tenant_id, state.quotas_of(tenant_id))
        slots = _primitives(state)
        if self._lock is None:
            result = await slots.predict(tenant_id, obs, version, "mean")
        else:
            async with self._lock:
                result = await slots.predict(tenant_id, obs, version, "mean")
        return result.actions[0], int(result.policy_version)


async def answer_frames(
    websocket: WebSocket,
    adapter: ObservationAdapter,
    max_frame_bytes: int,
    infer: Infer,
    decoded: Callable[[float], None],
    tenant_id: str,
) -> None:
    """Answer the connection's request frames until the robot leaves or one fails
    (then the error text frame and close 1011). ``decoded`` gets each frame's decode
    seconds; it runs in the model process, or in a front process."""
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
            obs = adapter.batch(unpackb(frame, max_bytes=max_frame_bytes))
            infer_start = time.monotonic()
            decoded(infer_start - started)
            actions, version = await infer(obs)
            infer_ms = (time.monotonic() - infer_start) * 1000.0
        except JoyNexusError as exc:
            await fail(websocket, exc.message)
            return
        except Exception:
            log.exception("openpi request of tenant %s failed", tenant_id)
            await fail(websocket, INTERNAL_ERROR_TEXT)
            return
        server_timing: dict[str, float] = {"infer_ms": infer_ms}
        if prev_total_ms is not None:  # like openpi: the previous request's send included
            server_timing["prev_total_ms"] = prev_total_ms
        answer = {
            "actions": actions,
            "policy_version": version,
            "policy_timing": {"infer_ms": infer_ms},
            "server_timing": server_timing,
        }
        await websocket.send_bytes(packb(answer))
        prev_total_ms = (time.monotonic() - started) * 1000.0


def _meter(state: ServerState, stage: str, seconds: float) -> None:
    from joynexus.server.routes.models import stage_meter

    stages = stage_meter(state)
    if stages is not None:
        stages.add(stage, seconds)


def _primitives(state: ServerState) -> ModelPrimitives:
    """The model primitives behind the tenant gateway (503 when this server has none)."""
    return state.gateway.primitives


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
    """Refuse the connection with the error's status and message in the close frame."""
    await refuse(websocket, exc)


async def fail(websocket: WebSocket, text: str) -> None:
    """The error text frame, then close 1011 (what ``infer`` raises as RuntimeError)."""
    await websocket.send_text(text)
    await websocket.close(code=CLOSE_INTERNAL_ERROR, reason="error; see the previous frame")
