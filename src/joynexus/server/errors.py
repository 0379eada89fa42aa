"""Exception handlers: every error leaves the server as ``{"code", "message", "details"}``.

* :class:`~joynexus.errors.JoyNexusError` → its ``http_status`` and ``to_dict()``;
  quota refusals also set ``Retry-After`` and 401s ``WWW-Authenticate``.
* Request validation (FastAPI's and :func:`~joynexus.server.wire.decode_body`'s) → 422
  ``invalid_request`` with ``details.errors`` = ``[{"loc", "msg", "type"}]``.
* Starlette HTTP errors (unknown route, wrong method) → their status, ``not_found`` /
  ``method_not_allowed`` / ``http_error``.
* Anything else is a bug → 500 ``internal_error`` with the request id in the body and
  the traceback in the log, never the exception text (it may hold internals).
"""

from __future__ import annotations

import logging
import math
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from joynexus.errors import (
    AuthenticationError,
    JoyNexusError,
    QuotaExceededError,
    StorageFullError,
)
from joynexus.utils.storage import StorageFault, storage_full_cause

__all__ = [
    "REQUEST_ID_HEADER",
    "document_error_bodies",
    "error_response",
    "install_error_handlers",
    "request_id",
]

log = logging.getLogger("joynexus.server")

REQUEST_ID_HEADER = "X-Request-ID"


def request_id(request: Request) -> str:
    """This request's id (set by the middleware; generated if missing)."""
    rid = getattr(request.state, "request_id", None)
    if not isinstance(rid, str):
        rid = uuid.uuid4().hex
        request.state.request_id = rid
    return rid


def _body(code: str, message: str, details: dict[str, Any]) -> dict[str, Any]:
    return {"code": code, "message": message, "details": details}


def _json_safe(value: Any) -> Any:
    if isinstance(value, str | bool | int) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    return str(value)


async def _joynexus_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, JoyNexusError)
    if exc.http_status == 500 and (full := storage_full_cause(exc)) is not None:
        return _storage_full(request, full)  # a layer wrapped a full disk as its failure
    headers = {REQUEST_ID_HEADER: request_id(request)}
    if isinstance(exc, QuotaExceededError):
        retry = exc.details.get("retry_after_s")
        headers["Retry-After"] = str(max(1, math.ceil(retry)) if isinstance(retry, float) else 1)
    if isinstance(exc, AuthenticationError):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, StorageFullError):
        headers["Retry-After"] = "60"
    return JSONResponse(
        _body(exc.code, exc.message, _json_safe(exc.details)),
        status_code=exc.http_status,
        headers=headers,
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in exc.errors()
    ]
    where = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5])
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return JSONResponse(
        _body("invalid_request", f"request validation failed: {where}{more}", {"errors": errors}),
        status_code=422,
        headers={REQUEST_ID_HEADER: request_id(request)},
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    headers[REQUEST_ID_HEADER] = request_id(request)
    return JSONResponse(
        _body(code, str(exc.detail), {}), status_code=exc.status_code, headers=headers
    )


def _storage_full(request: Request, full: StorageFault) -> JSONResponse:
    """507 with the reason: a write hit a full disk (never a generic 500)."""
    rid = request_id(request)
    log.error(
        "storage full in %s %s (request %s): %s",
        request.method,
        request.url.path,
        rid,
        full.reason,
    )
    error = StorageFullError(
        f"the server's disk is full ({full.reason}); retry once an operator freed space",
        request_id=rid,
    )
    return JSONResponse(
        _body(error.code, error.message, error.details),
        status_code=error.http_status,
        headers={REQUEST_ID_HEADER: rid, "Retry-After": "60"},
    )


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    rid = request_id(request)
    full = storage_full_cause(exc)
    if full is not None:
        return _storage_full(request, full)
    log.error(
        "internal error in %s %s (request %s)",
        request.method,
        request.url.path,
        rid,
        exc_info=exc,
    )
    return JSONResponse(
        _body(
            "internal_error",
            f"internal server error; quote request id {rid} when reporting it",
            {"request_id": rid},
        ),
        status_code=500,
        headers={REQUEST_ID_HEADER: rid},
    )


ERROR_BODY_SCHEMA: dict[str, Any] = {
    "title": "ErrorBody",
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "machine-readable error code"},
        "message": {"type": "string", "description": "what went wrong, for people"},
        "details": {"type": "object", "additionalProperties": True},
    },
    "required": ["code", "message", "details"],
}


def document_error_bodies(document: dict[str, Any]) -> None:
    """Make the OpenAPI document describe the error bodies this server really sends."""
    ref = {"$ref": "#/components/schemas/ErrorBody"}
    error = {"description": "Error", "content": {"application/json": {"schema": ref}}}
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            responses = operation.setdefault("responses", {})
            if "422" in responses:
                responses["422"] = {**error, "description": "Validation Error"}
            responses.setdefault("4XX", error)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["ErrorBody"] = ERROR_BODY_SCHEMA


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers above on ``app``."""
    app.add_exception_handler(JoyNexusError, _joynexus_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)


async def error_response(request: Request, exc: Exception) -> JSONResponse:
    """The response the handlers above give ``exc`` (for code that runs outside a
    route: the front processes' hub answers a predict's errors with it)."""
    if isinstance(exc, JoyNexusError):
        return await _joynexus_error(request, exc)
    if isinstance(exc, RequestValidationError):
        return await _validation_error(request, exc)
    if isinstance(exc, StarletteHTTPException):
        return await _http_error(request, exc)
    return await _unexpected(request, exc)
