"""The openpi websocket in a front process: decoded here, answered by the model process.

The front opens the robot's connection upstream, on the model process's own gateway,
with the server's front token (:data:`~joynexus.server.openpi.gateway.FRONT_HEADER`):
the handshake and its refusals (401/403/404/409/429, a close frame of code 4000 + the
status whose reason the robot gets unchanged), the per-tenant connection bound and the
metadata frame are the gateway's, unchanged. The gateway then sends the connection's
description (tenant, pinned version, schema and openpi options) and holds the upstream
connection open — it counts toward the bound until the robot leaves. Each request
frame is decoded and validated here by the gateway's own
:func:`~joynexus.server.openpi.gateway.answer_frames` and
:class:`~joynexus.server.openpi.observations.ObservationAdapter`; the observation
tensors go to the model process through this front's shared-memory slots, like a
predict's (``HubClient.openpi``), and the answer frame is encoded here. An error
is the gateway's text frame and close 1011, with the gateway's text.

When the model process closes the upstream connection (it stops or restarts) the robot
gets that close; when this front dies, the robot's connection closes with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import Response, WebSocket

from joynexus.models.batch import ObservationBatch
from joynexus.server.errors import REQUEST_ID_HEADER
from joynexus.server.openpi.gateway import (
    CLOSE_INTERNAL_ERROR,
    FRONT_HEADER,
    answer_frames,
    described,
)

if TYPE_CHECKING:
    import numpy as np


class Hub(Protocol):
    """What this needs of the front's hub client (``app.HubClient``)."""

    async def openpi(
        self, tenant_id: str, version: int | None, obs: ObservationBatch, decode_s: float
    ) -> tuple[np.ndarray, int]: ...


__all__ = ["Hub", "connect_upstream", "decode_websocket"]


async def connect_upstream(
    websocket: WebSocket,
    loopback: str,
    extra: list[tuple[str, str]] | None = None,
    path: str | None = None,
) -> Any:
    """The upstream connection for ``websocket`` to ``path`` (default: its own path) on
    the loopback server, or None when it was refused there (the client got the same
    status and body) or the model process is not answering (the client got close 1011)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    url = "ws" + loopback.removeprefix("http") + (path or websocket.url.path)
    if websocket.url.query:
        url += "?" + websocket.url.query
    keep = {"authorization", "api-key", REQUEST_ID_HEADER.lower()}
    headers = [(k, v) for k, v in websocket.headers.items() if k.lower() in keep]
    try:
        return await connect(
            url,
            additional_headers=headers + (extra or []),
            max_size=None,
            compression=None,
            proxy=None,
        )
    except InvalidStatus as exc:  # refused at the handshake: the same status and body
        refused = exc.response
        await websocket.send_denial_response(
            Response(
                bytes(refused.body or b""),
                status_code=refused.status_code,
                media_type=refused.headers.get("content-type"),
            )
        )
    except OSError:
        await websocket.close(code=1011, reason="the model process is not answering")
    return None


async def decode_websocket(
    websocket: WebSocket, loopback: str, hub: Hub, front_token: str, path: str | None = None
) -> None:
    """Serve one openpi connection, decoding its frames here (see the module docstring).

    Args:
        path: The gateway's path on the loopback server (default: the connection's own;
            the openpi port's ``/`` names :data:`~joynexus.server.openpi.app.PATH`).
    """
    from websockets.exceptions import ConnectionClosed

    upstream = await connect_upstream(websocket, loopback, [(FRONT_HEADER, front_token)], path)
    if upstream is None:
        return
    await websocket.accept()
    try:
        metadata = await upstream.recv()
        conn = described(await upstream.recv())
    except ConnectionClosed:  # refused (its code and reason relayed), or the model
        # process went away before the metadata
        with contextlib.suppress(Exception):
            await websocket.close(
                code=upstream.close_code or CLOSE_INTERNAL_ERROR,
                reason=upstream.close_reason or "",
            )
        await upstream.close()
        return
    await websocket.send_bytes(metadata)
    decode_s = 0.0

    def decoded(seconds: float) -> None:
        nonlocal decode_s
        decode_s = seconds

    async def infer(obs: ObservationBatch) -> tuple[np.ndarray, int]:
        return await hub.openpi(conn.tenant_id, conn.version, obs, decode_s)

    frames = asyncio.create_task(
        answer_frames(websocket, conn.adapter, conn.max_frame_bytes, infer, decoded, conn.tenant_id)
    )
    gone = asyncio.create_task(upstream.wait_closed())
    try:
        await asyncio.wait([frames, gone], return_when=asyncio.FIRST_COMPLETED)
        if not frames.done():  # the model process closed it: the robot gets that close
            frames.cancel()
            with contextlib.suppress(Exception):
                await websocket.close(
                    code=upstream.close_code or CLOSE_INTERNAL_ERROR,
                    reason=upstream.close_reason or "the model process closed the connection",
                )
    finally:
        for task in (frames, gone):
            task.cancel()
        await asyncio.gather(frames, gone, return_exceptions=True)
        await upstream.close()
