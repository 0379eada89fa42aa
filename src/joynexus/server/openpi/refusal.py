"""How the openpi door refuses a connection, so that the robot's exception says why.

``openpi_client.WebsocketClientPolicy`` connects with ``websockets``; a refusal sent as
an HTTP status before the upgrade becomes ``InvalidStatus``, whose text is only
"server rejected WebSocket connection: HTTP 401" — the reason would sit in
``exc.response.body``, where nobody looks. So a refusal here completes the handshake
and closes at once with a close frame that carries both: the code is ``4000 + the HTTP
status`` (4401 unauthenticated, 4403 forbidden, 4404 no served policy, 4409 pinned
version not served, 4429 too many connections; the private-use range, as other
websocket APIs map HTTP statuses), the reason is the error's message. The client's
first ``recv`` (reading the metadata frame) then raises ``ConnectionClosedError`` whose
text reads ``received 4401 (private use) invalid or revoked API key; ...``.

RFC 6455 bounds a close reason to 123 bytes of UTF-8: a longer message is cut at a
character boundary and ends with "…" (the full text is in the server's log).
"""

from __future__ import annotations

import logging

from starlette.websockets import WebSocket

from joynexus.errors import JoyNexusError

__all__ = ["CLOSE_CODE_BASE", "MAX_CLOSE_REASON_BYTES", "close_code", "close_reason", "refuse"]

log = logging.getLogger(__name__)

#: A refusal's close code is this plus the HTTP status it stands for.
CLOSE_CODE_BASE = 4000
#: The longest close reason RFC 6455 allows (a 125-byte payload less the 2-byte code).
MAX_CLOSE_REASON_BYTES = 123
_ELLIPSIS = "…"


def close_code(exc: JoyNexusError) -> int:
    """The close code standing for the error's HTTP status (4xx -> 44xx, 503 -> 4503)."""
    return CLOSE_CODE_BASE + exc.http_status


def close_reason(message: str) -> str:
    """``message`` on one line, cut to fit a close frame (at most 123 UTF-8 bytes)."""
    text = " ".join(message.split())
    if len(text.encode()) <= MAX_CLOSE_REASON_BYTES:
        return text
    room = MAX_CLOSE_REASON_BYTES - len(_ELLIPSIS.encode())
    cut = text.encode()[:room].decode(errors="ignore")  # never half a character
    return cut.rstrip() + _ELLIPSIS


async def refuse(websocket: WebSocket, exc: JoyNexusError) -> None:
    """Complete the handshake, then close with the error's code and reason (see above)."""
    log.info("openpi connection refused (%s): %r", exc.http_status, exc.message)
    await websocket.accept()
    await websocket.close(code=close_code(exc), reason=close_reason(exc.message))
