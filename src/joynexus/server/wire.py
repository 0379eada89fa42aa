"""HTTP side of the wire: tensor fields, body decoding, content negotiation.

Control messages are JSON and use FastAPI's ordinary body parsing. Endpoints that move
tensors (observations, actions, queue data) read their body themselves with
:func:`decode_body`, which accepts

* ``application/msgpack`` — arrays as the msgpack extension of :mod:`joynexus.wire`;
* ``application/json`` — arrays as ``{"dtype", "shape", "data": <base64>}``;

and answer with :func:`respond`: msgpack when the ``Accept`` header asks for it, JSON
otherwise. Both forms validate into the same pydantic model, whose :data:`Tensor`
fields hold numpy arrays; the OpenAPI document describes the JSON form (see
:func:`tensor_body` / :func:`tensor_response`, which register the models whose schemas
:func:`add_component_schemas` adds to the document).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

import numpy as np
import numpy.typing as npt
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, PlainSerializer, PlainValidator, ValidationError, WithJsonSchema
from pydantic_core import core_schema

from joynexus.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaTypeError
from joynexus.wire import (
    MAX_DIM,
    MSGPACK_MEDIA_TYPE,
    packb,
    tensor_from_json,
    tensor_to_json,
    unpackb,
)

__all__ = [
    "Tensor",
    "add_component_schemas",
    "answer_nbytes",
    "decode_body",
    "decode_bytes",
    "read_body",
    "respond",
    "respond_fields",
    "tensor_body",
    "tensor_response",
    "wants_msgpack",
]

M = TypeVar("M", bound=BaseModel)

_MSGPACK_TYPES = (MSGPACK_MEDIA_TYPE, "application/x-msgpack", "application/vnd.msgpack")

TENSOR_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Tensor",
    "description": (
        "An n-dimensional array. JSON: dtype, shape and base64 of the raw little-endian "
        "C-order bytes. msgpack bodies carry arrays as extension type 42 instead."
    ),
    "properties": {
        "dtype": {"type": "string", "examples": ["float32", "uint8", "<U256"]},
        "shape": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": MAX_DIM},
            "maxItems": 8,
        },
        "data": {"type": "string", "contentEncoding": "base64"},
    },
    "required": ["dtype", "shape", "data"],
    "additionalProperties": False,
}


def _validate_tensor(value: Any, info: core_schema.ValidationInfo) -> npt.NDArray[Any]:
    try:
        arr = tensor_from_json(value, name="tensor")
    except InvalidRequestError as exc:
        # A ValueError becomes a located pydantic error: the 422 names the field.
        raise ValueError(exc.message) from None
    limit = (info.context or {}).get("max_tensor_bytes")
    if isinstance(limit, int) and arr.nbytes > limit:
        raise ValueError(f"tensor of {arr.nbytes} bytes exceeds the limit of {limit} bytes")
    return arr


def _serialize_tensor(value: Any, info: core_schema.SerializationInfo) -> Any:
    return tensor_to_json(value) if info.mode_is_json() else value


#: A pydantic field type holding a numpy array (see the module docstring for the wire forms).
Tensor = Annotated[
    np.ndarray,
    PlainValidator(_validate_tensor),
    PlainSerializer(_serialize_tensor),
    WithJsonSchema(TENSOR_JSON_SCHEMA),
]

_REGISTERED: dict[str, tuple[type[BaseModel], str]] = {}


def _ref(model: type[BaseModel], mode: str) -> dict[str, Any]:
    _REGISTERED[f"{model.__name__}:{mode}"] = (model, mode)
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def tensor_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads ``model`` with :func:`decode_body`."""
    ref = _ref(model, "validation")
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ref}, MSGPACK_MEDIA_TYPE: {"schema": ref}},
        }
    }


def tensor_response(model: type[BaseModel], description: str = "OK") -> dict[int | str, Any]:
    """``responses`` for a route that answers ``model`` with :func:`respond`."""
    ref = _ref(model, "serialization")
    return {
        200: {
            "description": description,
            "content": {"application/json": {"schema": ref}, MSGPACK_MEDIA_TYPE: {"schema": ref}},
        }
    }


def add_component_schemas(document: dict[str, Any]) -> None:
    """Add the schemas of every model registered by the two helpers above."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for model, mode in _REGISTERED.values():
        schema = model.model_json_schema(
            ref_template="#/components/schemas/{model}",
            mode=mode,  # type: ignore[arg-type]  # pydantic types mode as a Literal
        )
        for name, sub in schema.pop("$defs", {}).items():
            schemas.setdefault(name, sub)
        schemas.setdefault(model.__name__, schema)
    document["components"]["schemas"] = dict(sorted(schemas.items()))


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refusing more than ``max_bytes`` before reading it all.

    Raises:
        PayloadTooLargeError: the declared or actual length exceeds ``max_bytes``.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLargeError(
            f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes",
            limit_bytes=max_bytes,
        )
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_bytes:
            raise PayloadTooLargeError(
                f"request body exceeds the limit of {max_bytes} bytes", limit_bytes=max_bytes
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _media_type(header: str | None) -> str:
    return (header or "").split(";", 1)[0].strip().lower()


async def decode_body(
    request: Request, model: type[M], *, max_body_bytes: int, max_tensor_bytes: int
) -> M:
    """Read, decode (JSON or msgpack) and validate a request body into ``model``.

    Raises:
        PayloadTooLargeError, UnsupportedMediaTypeError, InvalidRequestError: bad bodies.
        RequestValidationError: the body does not match ``model`` (answered as 422).
    """
    raw = await read_body(request, max_body_bytes)
    return decode_bytes(
        raw, request.headers.get("content-type"), model, max_tensor_bytes=max_tensor_bytes
    )


def decode_bytes(
    raw: bytes, content_type: str | None, model: type[M], *, max_tensor_bytes: int
) -> M:
    """Decode (JSON or msgpack) and validate a body already read into ``model``.

    Raises:
        UnsupportedMediaTypeError, InvalidRequestError: bad bodies.
        RequestValidationError: the body does not match ``model`` (answered as 422).
    """
    media = _media_type(content_type)
    if media in _MSGPACK_TYPES:
        obj = unpackb(raw)
    elif media in ("", "application/json"):
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise InvalidRequestError(f"body is not valid JSON: {exc}") from None
    else:
        raise UnsupportedMediaTypeError(
            f"content type {media!r} is not accepted; send application/json or "
            f"{MSGPACK_MEDIA_TYPE}",
            allowed=["application/json", MSGPACK_MEDIA_TYPE],
        )
    try:
        return model.model_validate(obj, context={"max_tensor_bytes": max_tensor_bytes})
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def wants_msgpack(request: Request) -> bool:
    """True when the client's ``Accept`` header names a msgpack media type."""
    accept = request.headers.get("accept", "").lower()
    return any(t in accept for t in _MSGPACK_TYPES)


#: Bytes one tensor of an answer adds to its data, at most, in either encoding: its
#: field name (≤ 128 characters), dtype, up to 32 dimensions and the framing.
TENSOR_ANSWER_OVERHEAD = 1024


def answer_nbytes(tensor_nbytes: int, tensors: int, *, msgpack: bool) -> int:
    """Bound of the bytes :func:`respond` makes of ``tensors`` arrays that hold
    ``tensor_nbytes`` bytes together: msgpack carries the raw bytes, JSON their base64
    (4 characters per 3 bytes, so a JSON answer is a third larger than its tensors)."""
    data = tensor_nbytes if msgpack else 4 * (-(-tensor_nbytes // 3) + tensors)
    return data + tensors * TENSOR_ANSWER_OVERHEAD


def respond(request: Request, model: BaseModel, status_code: int = 200) -> Response:
    """Serialize ``model`` as msgpack or JSON, as the client's ``Accept`` asks."""
    if wants_msgpack(request):
        return Response(
            packb(model.model_dump(mode="python")),
            status_code=status_code,
            media_type=MSGPACK_MEDIA_TYPE,
        )
    return JSONResponse(model.model_dump(mode="json"), status_code=status_code)


def respond_fields(request: Request, model: type[BaseModel], fields: dict[str, Any]) -> Response:
    """``respond(request, model.model_construct(**fields))`` for a model of plain fields
    (arrays, numbers, ``None``: what its python dump gives back unchanged). A msgpack
    answer packs ``fields`` themselves, in the model's field order, without building
    and dumping the model: the same bytes, for a third of a cold answer's encoding."""
    if wants_msgpack(request) and list(fields) == list(model.model_fields):
        return Response(packb(fields), media_type=MSGPACK_MEDIA_TYPE)
    return respond(request, model.model_construct(**fields))
