"""The shared msgpack array codec: round trips, and refusals of malformed input."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import torch

from joynexus.errors import InvalidRequestError, SchemaMismatchError
from joynexus.wire import ND_EXT, check_tensor, packb, tensor_from_json, tensor_to_json, unpackb


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        np.zeros((0, 5), np.uint8),
        np.array([True, False]),
        np.array(["pick up the cup", "x"]).astype("<U256"),
        np.array(3.5),
    ],
)
def test_round_trip_msgpack_and_json(arr: np.ndarray) -> None:
    back = unpackb(packb({"a": arr}))["a"]
    assert back.dtype == arr.dtype and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)
    again = tensor_from_json(tensor_to_json(arr))
    assert again.dtype == arr.dtype
    np.testing.assert_array_equal(again, arr)


def test_torch_tensors_encode_without_the_codec_importing_torch() -> None:
    back = unpackb(packb(torch.arange(6, dtype=torch.float32).reshape(2, 3)))
    assert back.dtype == np.float32 and back.tolist() == [[0, 1, 2], [3, 4, 5]]


def _ext(header: object, payload: bytes) -> bytes:
    body: bytes = msgpack.packb(header) + payload
    out: bytes = msgpack.packb({"a": msgpack.ExtType(ND_EXT, body)}, use_bin_type=True)
    return out


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (_ext(["<f4", [2, 2]], b"\0" * 15), "needs 16 bytes, got 15"),
        (_ext(["|O", [1]], b"\0" * 8), "not allowed"),
        (_ext([">f4", [1]], b"\0" * 4), "big-endian"),
        (_ext(["<f4", [-1]], b""), "non-negative"),
        (_ext(["<f4", "2x2"], b""), "shape"),
        (_ext(7, b""), r"\[dtype, shape\]"),
        (_ext(["V8", [1]], b"\0" * 8), "not allowed"),
        (_ext(["<c8", [1]], b"\0" * 8), "not allowed"),
        (msgpack.packb(msgpack.ExtType(3, b"x")), "extension type 3"),
        (packb({"a": np.zeros(4, np.float32)})[:-3], "not valid msgpack"),
        (b"\xc1", "not valid msgpack"),
    ],
)
def test_malformed_arrays_are_invalid_requests(data: bytes, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        unpackb(data)


def test_json_tensor_refusals() -> None:
    with pytest.raises(InvalidRequestError, match="base64"):
        tensor_from_json({"dtype": "float32", "shape": [1], "data": "***"})
    with pytest.raises(InvalidRequestError, match="exactly"):
        tensor_from_json({"dtype": "float32", "shape": [1]})
    with pytest.raises(InvalidRequestError, match="needs 8 bytes"):
        tensor_from_json({"dtype": "float32", "shape": [2], "data": "AAAA"})


def test_check_tensor_names_the_field_and_the_expectation() -> None:
    arr = np.zeros((2, 3), np.float32)
    assert check_tensor(arr, name="x", dtypes=("float32",), shape=(None, 3)) is arr
    with pytest.raises(SchemaMismatchError, match=r"actions: shape \[2, 3\] does not match"):
        check_tensor(arr, name="actions", shape=(2, 7))
    with pytest.raises(SchemaMismatchError, match="expected one of"):
        check_tensor(arr, name="x", dtypes=("uint8",))
    with pytest.raises(InvalidRequestError, match="NaN"):
        check_tensor(np.array([1.0, np.nan], np.float32), name="x", finite=True)
    with pytest.raises(InvalidRequestError, match="exceeds the limit"):
        check_tensor(arr, name="x", max_bytes=8)


def test_an_accepted_dtype_is_remembered_and_a_refused_one_stays_refused() -> None:
    from joynexus.wire import parse_dtype

    first = parse_dtype("<f4")
    assert parse_dtype("<f4") is first and first == np.float32
    for _ in range(2):  # refused every time, never remembered
        with pytest.raises(InvalidRequestError, match="big-endian"):
            parse_dtype(">f4")
        with pytest.raises(InvalidRequestError, match="not allowed"):
            parse_dtype("O")
    decoded = unpackb(packb({"a": np.arange(6, dtype=np.float32).reshape(2, 3)}))["a"]
    decoded[0, 0] = 7.0  # a writable array of its own, not a view of the body
    assert decoded.flags.owndata and float(decoded[0, 0]) == 7.0


def test_answering_with_fields_gives_the_models_own_bytes() -> None:
    from starlette.requests import Request

    from joynexus.server.routes.models import PredictOut
    from joynexus.server.wire import respond, respond_fields
    from joynexus.wire import MSGPACK_MEDIA_TYPE

    def request(accept: str) -> Request:
        return Request({"type": "http", "headers": [(b"accept", accept.encode())]})

    fields = {
        "actions": np.arange(8, dtype=np.float32).reshape(1, 4, 2),
        "log_probs": np.zeros(1, np.float32),
        "values": None,
        "policy_version": 3,
        "flow_chain": None,
    }
    for accept in (MSGPACK_MEDIA_TYPE, "application/json"):
        want = respond(request(accept), PredictOut.model_construct(**fields))
        got = respond_fields(request(accept), PredictOut, fields)
        assert got.body == want.body and got.media_type == want.media_type, accept
    # Fields in another order go through the model, so the bytes stay the model's.
    shuffled = dict(reversed(list(fields.items())))
    want = respond(request(MSGPACK_MEDIA_TYPE), PredictOut.model_construct(**fields))
    assert respond_fields(request(MSGPACK_MEDIA_TYPE), PredictOut, shuffled).body == want.body
