"""What the sync and async clients share: calls, retries, errors, typed results.

Every API operation is described once as a :class:`Call` (method, path, body, how to
parse the answer); :class:`~joynexus.client.sync.Client` and
:class:`~joynexus.client.aio.AsyncClient` only execute calls, so the two stay in step.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict

from joynexus.wire import MSGPACK_MEDIA_TYPE, packb, unpackb

__all__ = [
    "APIError",
    "Call",
    "FutureInfo",
    "Prediction",
    "RetryPolicy",
    "ServerUnreachableError",
    "StepInfo",
]

RETRY_STATUSES = (429, 503)


class APIError(Exception):
    """An error answer of the server: HTTP status, machine code, message, details.

    ``str()`` is ``HTTP <status> <code>: <the server's message>``, so a traceback or a
    plain ``print(exc)`` says why the server refused, not only its status.
    """

    def __init__(
        self, status: int, code: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})


class ServerUnreachableError(APIError, httpx.TransportError):
    """No answer from the server: nothing listens at the URL, or the connection failed.

    An :class:`APIError` (status 0, code ``unreachable``), so every command that prints
    API errors prints this one as its one line, and an ``httpx.TransportError``, so code
    that waits for a server to come up keeps working. ``str()`` is the message alone:
    where, why, and how to point the client elsewhere.
    """

    def __init__(self, url: str, cause: httpx.TransportError) -> None:
        why = str(cause).strip() or type(cause).__name__
        if isinstance(cause, httpx.ConnectError | httpx.ConnectTimeout):
            what = f"no server answers at {url} ({why})"
        else:
            what = f"the server at {url} did not answer ({type(cause).__name__}: {why})"
        message = (
            f"{what}; start one with `joynexus serve`, or point --url or JOYNEXUS_URL "
            "at a running server"
        )
        super().__init__(0, "unreachable", message, {"url": url})

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff on 429 / 503 (and connection errors).

    Attributes:
        max_retries: Retries after the first attempt.
        backoff_s: First delay; each retry doubles it, up to ``max_backoff_s``.
        max_backoff_s: Longest delay, also the cap on a server's ``Retry-After``.
    """

    max_retries: int = 5
    backoff_s: float = 0.25
    max_backoff_s: float = 30.0

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        """Seconds to wait before retry ``attempt`` (0-based); ``Retry-After`` wins."""
        wait = float(min(self.backoff_s * (2.0**attempt), self.max_backoff_s))
        if response is not None:
            hinted = _retry_after(response.headers.get("retry-after"))
            if hinted is not None:
                wait = min(max(wait, hinted), self.max_backoff_s)
        return wait


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value)
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def _identity(value: Any) -> Any:
    return value


@dataclass
class Call:
    """One HTTP operation.

    Attributes:
        method / path: The request line.
        json: A JSON body.
        msgpack: A msgpack body (tensors as numpy arrays).
        params: Query parameters.
        accept_msgpack: Ask for a msgpack answer (tensor results).
        parse: Turns the decoded answer into the typed result.
        raw: Return the raw bytes (downloads).
    """

    method: str
    path: str
    json: Any = None
    msgpack: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    accept_msgpack: bool = False
    parse: Callable[[Any], Any] = _identity
    raw: bool = False

    def request_kwargs(self) -> dict[str, Any]:
        headers: dict[str, str] = {}
        kw: dict[str, Any] = {"params": self.params or None}
        if self.msgpack is not None:
            headers["Content-Type"] = MSGPACK_MEDIA_TYPE
            kw["content"] = packb(self.msgpack)
        elif self.json is not None:
            kw["json"] = self.json
        if self.accept_msgpack:
            headers["Accept"] = MSGPACK_MEDIA_TYPE
        kw["headers"] = headers
        return kw

    def result(self, response: httpx.Response) -> Any:
        """The parsed result of a successful response; raises :class:`APIError` otherwise."""
        if response.status_code >= 400:
            raise error_of(response)
        if self.raw:
            return self.parse(response.content)
        if not response.content:
            return self.parse(None)
        media = response.headers.get("content-type", "")
        if media.startswith(MSGPACK_MEDIA_TYPE):
            return self.parse(unpackb(response.content))
        return self.parse(response.json())


def error_of(response: httpx.Response) -> APIError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        return APIError(
            response.status_code,
            str(body["code"]),
            str(body.get("message", "")),
            body.get("details") or {},
        )
    # Not one of ours (a proxy, a bare ASGI error): its text is the best reason there is.
    text = response.text.strip()[:500] or response.reason_phrase or "no body"
    return APIError(response.status_code, "http_error", text)


class FutureInfo(BaseModel):
    """A long operation's state (``result`` once succeeded, ``error`` once failed)."""

    model_config = ConfigDict(extra="forbid")

    future_id: str
    kind: str
    state: str
    created_at: float | None = None
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class Prediction:
    """``predict``: ``actions [B, chunk, A]``, log-probs / values ``[B]`` when present, and
    a flow_matching head's Flow-SDE chain ``[B, steps + 1, chunk, A]`` in sample mode."""

    actions: np.ndarray
    log_probs: np.ndarray | None
    values: np.ndarray | None
    policy_version: int
    flow_chain: np.ndarray | None = None


class StepInfo(BaseModel):
    """``train_batch``: the loss before the step and the version after it."""

    model_config = ConfigDict(extra="forbid")

    loss: float
    policy_version: int
    grad_norm: float


def prediction(body: Mapping[str, Any]) -> Prediction:
    return Prediction(
        actions=np.asarray(body["actions"]),
        log_probs=None if body.get("log_probs") is None else np.asarray(body["log_probs"]),
        values=None if body.get("values") is None else np.asarray(body["values"]),
        policy_version=int(body["policy_version"]),
        flow_chain=None if body.get("flow_chain") is None else np.asarray(body["flow_chain"]),
    )


def train_batch_body(
    cameras: Mapping[str, np.ndarray],
    state: np.ndarray,
    instructions: list[str],
    actions: np.ndarray,
    *,
    loss: str,
    tensors: Mapping[str, np.ndarray | None],
) -> dict[str, Any]:
    """A ``train_batch`` body: observations with actions, the loss, and the float32
    tensors given (``advantages``, ``old_log_probs``, ``returns``, ``flow_chain``)."""
    body: dict[str, Any] = {
        "observations": observations(cameras, state, instructions, actions),
        "loss": loss,
    }
    for name, value in tensors.items():
        if value is not None:
            body[name] = np.ascontiguousarray(value, dtype=np.float32)
    return body


def observations(
    cameras: Mapping[str, np.ndarray],
    state: np.ndarray,
    instructions: list[str],
    actions: np.ndarray | None = None,
) -> dict[str, Any]:
    """An observation batch as the model routes read it."""
    out: dict[str, Any] = {
        "cameras": {k: np.ascontiguousarray(v, dtype=np.uint8) for k, v in cameras.items()},
        "state": np.ascontiguousarray(state, dtype=np.float32),
        "instructions": list(instructions),
    }
    if actions is not None:
        out["actions"] = np.ascontiguousarray(actions, dtype=np.float32)
    return out
