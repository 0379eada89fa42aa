"""The model process's end of the front processes: the hub.

Every front process connects to the hub's Unix socket once and sends ``hello`` with its
index, then one ``predict`` frame per decoded request (:mod:`.channel`: the tensors
lie in the front's shared-memory slot, the frame carries their descriptors). For each,
the hub copies the tensors out, authenticates the key, spends the tenant's rate-limit
token and checks the slot exactly as the ``predict`` route does (the same functions),
awaits the Master's ``predict`` — the one call that batches and touches the device —
and answers ``ok`` with the result arrays, or ``error`` with the status, body and
headers the server's error handlers give (byte for byte the route's error bodies).
An ``openpi`` frame is one openpi request frame a front decoded: the hub answers it with
the openpi gateway's own :meth:`~joynexus.server.openpi.gateway.OpenPIGateway.infer`
(rate-limit token, then ``predict``) and its error text.

A front that dies closes its connection: the hub forgets it, and answers of its
requests still in flight are dropped when they complete (nobody is left to read them).
The front's ``http_read`` and ``http_decode`` seconds ride on its predict frames and its
``http_encode`` seconds on the next one, so the predict-stage meter keeps every stage.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.security.utils import get_authorization_scheme_param
from starlette.requests import Request

from joynexus.errors import JoyNexusError
from joynexus.models.batch import ObservationBatch
from joynexus.server.errors import error_response
from joynexus.server.front.channel import encode_frame, read_frame, take_arrays
from joynexus.server.openpi.app import OPENPI
from joynexus.server.openpi.gateway import INTERNAL_ERROR_TEXT, OpenPIGateway
from joynexus.server.routes.models import own_slot
from joynexus.server.routes.models import stage_meter as predict_stage_meter
from joynexus.server.state import ServerState, _principal, _tenant

__all__ = ["FrontHub"]

log = logging.getLogger("joynexus.server.front")


def credentials_of(authorization: str | None) -> HTTPAuthorizationCredentials | None:
    """What FastAPI's ``HTTPBearer(auto_error=False)`` makes of the header."""
    scheme, token = get_authorization_scheme_param(authorization)
    if not authorization or scheme.lower() != "bearer" or not token:
        return None
    return HTTPAuthorizationCredentials(scheme=scheme, credentials=token)


def _request(path: str, request_id: str) -> Request:
    """A stand-in request for the error handlers (they read its id, method and path)."""
    return Request(
        {
            "type": "http",
            "method": "POST",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "scheme": "http",
            "query_string": b"",
            "headers": [],
            "server": ("front", 0),
            "state": {"request_id": request_id},
        }
    )


@dataclass
class _Front:
    index: int
    writer: asyncio.StreamWriter
    block: shared_memory.SharedMemory | None
    alive: bool = True
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class FrontHub:
    """Serves the predict frames of every front process against ``state``."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._blocks: dict[int, shared_memory.SharedMemory] = {}
        self._server: asyncio.AbstractServer | None = None
        self.connected: dict[int, _Front] = {}

    def set_block(self, index: int, block: shared_memory.SharedMemory) -> None:
        """The shared-memory block front ``index`` (re)starts with."""
        self._blocks[index] = block

    async def start(self, path: Path) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=str(path))
        path.chmod(0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for front in list(self.connected.values()):
            front.alive = False
            front.writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        front: _Front | None = None
        try:
            hello = await read_frame(reader)
            if hello[0] != "hello":
                return
            index = int(hello[1])
            front = _Front(index, writer, self._blocks.get(index))
            self.connected[index] = front
            while True:
                message = await read_frame(reader)
                if message[0] in ("predict", "openpi"):
                    self._accept(front, message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the front exited or was killed: its answers are dropped
        finally:
            if front is not None:
                front.alive = False
                if self.connected.get(front.index) is front:
                    del self.connected[front.index]
            writer.close()

    def _accept(self, front: _Front, message: tuple[Any, ...]) -> None:
        kind, req_id, fields, refs, inline = message
        # Copied out before anything awaits: the front reuses the slot once answered.
        arrays = inline if refs is None else take_arrays(self._block(front), refs)
        if kind == "openpi":
            work = self._answer_openpi(front, req_id, fields, arrays)
        else:
            path, tenant, authorization, request_id, rest = fields
            work = self._answer(
                front, req_id, path, tenant, authorization, request_id, rest, arrays
            )
        task = asyncio.create_task(work)
        front.tasks.add(task)
        task.add_done_callback(front.tasks.discard)

    def _block(self, front: _Front) -> shared_memory.SharedMemory:
        assert front.block is not None, "a front sent slot descriptors without a block"
        return front.block

    async def _answer(
        self,
        front: _Front,
        req_id: int,
        path: str,
        tenant_path: str,
        authorization: str | None,
        request_id: str,
        rest: dict[str, Any],
        arrays: dict[str, Any],
    ) -> None:
        stages = predict_stage_meter(self.state)
        if stages is not None:
            stages.add("http_read", float(rest["read_s"]))
            stages.add("http_decode", float(rest["decode_s"]))
            if rest["encode_s"] > 0:  # the front's encoding of its earlier answers
                stages.add("http_encode", float(rest["encode_s"]), count=int(rest["encode_n"]))
        try:
            reply = await self._predict(req_id, tenant_path, authorization, arrays, rest)
        except Exception as exc:  # every error leaves as the handlers' body
            response = await error_response(_request(path, request_id), exc)
            headers = [
                (k.decode("latin-1"), v.decode("latin-1"))
                for k, v in response.raw_headers
                if k.lower() != b"content-length"
            ]
            reply = ("error", req_id, response.status_code, bytes(response.body), headers)
        if front.alive:  # a dead front's answer is dropped
            front.writer.write(encode_frame(reply))

    async def _predict(
        self,
        req_id: int,
        tenant_path: str,
        authorization: str | None,
        arrays: dict[str, Any],
        rest: dict[str, Any],
    ) -> tuple[Any, ...]:
        state = self.state
        # The route's own dependencies, in its order: key, role and rate limit, slot.
        principal = _tenant(state, _principal(state, credentials_of(authorization)))
        tenant = own_slot(tenant_path, principal, state)
        observations = _batch(arrays, rest["instructions"])
        result = await state.gateway.primitives.predict(
            tenant, observations, rest["policy_version"], rest["mode"]
        )
        return (
            "ok",
            req_id,
            {
                "actions": np.asarray(result.actions, dtype=np.float32),
                "log_probs": _f32(result.log_probs),
                "values": _f32(result.values),
                "policy_version": int(result.policy_version),
                "flow_chain": _f32(result.chain),
            },
        )

    async def _answer_openpi(
        self, front: _Front, req_id: int, fields: tuple[Any, ...], arrays: dict[str, Any]
    ) -> None:
        """One openpi observation a front decoded: ``("ok", id, (actions, version))`` or
        ``("error", id, text)``, the text the gateway's own loop would send."""
        tenant_id, version, instructions, decode_s = fields
        state = self.state
        stages = predict_stage_meter(state)
        if stages is not None:
            stages.add("openpi_decode_front", float(decode_s))
        gateway: OpenPIGateway = state.service(OPENPI)
        reply: tuple[Any, ...]
        try:
            answer = await gateway.infer(state, tenant_id, version, _batch(arrays, instructions))
            reply = ("ok", req_id, answer)
        except JoyNexusError as exc:
            reply = ("error", req_id, exc.message)
        except Exception:
            log.exception("openpi request of tenant %s failed", tenant_id)
            reply = ("error", req_id, INTERNAL_ERROR_TEXT)
        if front.alive:
            front.writer.write(encode_frame(reply))


def _batch(arrays: dict[str, Any], instructions: list[str]) -> ObservationBatch:
    """The observation batch a front's arrays (:func:`~.app.tensors_of`) describe."""
    return ObservationBatch(
        cameras={k[4:]: v for k, v in arrays.items() if k.startswith("cam:")},
        state=arrays["state"],
        instructions=list(instructions),
        actions=arrays.get("actions"),
    )


def _f32(value: Any) -> Any:
    return None if value is None else np.asarray(value, dtype=np.float32)
