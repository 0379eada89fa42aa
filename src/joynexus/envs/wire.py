"""msgpack encoding of env observations and steps (remote env protocol).

numpy arrays travel as a msgpack extension (dtype, shape, raw bytes): no base64, no
per-element boxing, so an image costs about one memory copy each way.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from joynexus.envs.base import EnvObservation, EnvStep
from joynexus.errors import InvalidRequestError

__all__ = [
    "decode_observation",
    "decode_step",
    "encode_observation",
    "encode_step",
    "packb",
    "unpackb",
]

_ND_EXT = 42


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        header = msgpack.packb([arr.dtype.str, list(arr.shape)])
        return msgpack.ExtType(_ND_EXT, header + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} for the remote env protocol")


def _ext_hook(code: int, data: bytes) -> Any:
    if code != _ND_EXT:
        return msgpack.ExtType(code, data)
    unpacker = msgpack.Unpacker()
    unpacker.feed(data)
    dtype, shape = unpacker.unpack()
    offset = unpacker.tell()
    return np.frombuffer(data, dtype=np.dtype(dtype), offset=offset).reshape(shape).copy()


def packb(obj: Any) -> bytes:
    """Encode a msgpack body; numpy arrays and scalars included."""
    out: bytes = msgpack.packb(obj, default=_default, use_bin_type=True)
    return out


def unpackb(data: bytes) -> Any:
    """Decode a msgpack body produced by :func:`packb`.

    Raises:
        InvalidRequestError: The body is not valid msgpack.
    """
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise InvalidRequestError(f"body is not valid msgpack: {exc}") from exc


def encode_observation(obs: EnvObservation) -> dict[str, Any]:
    return {"cameras": obs.cameras, "state": obs.state, "instruction": obs.instruction}


def decode_observation(data: dict[str, Any]) -> EnvObservation:
    return EnvObservation(
        cameras={str(k): np.asarray(v, np.uint8) for k, v in data["cameras"].items()},
        state=np.asarray(data["state"], np.float32),
        instruction=str(data["instruction"]),
    )


def encode_step(step: EnvStep) -> dict[str, Any]:
    info: dict[str, Any] = {}
    final = step.info.get("final_observation")
    if isinstance(final, EnvObservation):
        info["final_observation"] = encode_observation(final)
    return {
        "observation": encode_observation(step.observation),
        "reward": step.reward,
        "terminated": step.terminated,
        "truncated": step.truncated,
        "success": step.success,
        "info": info,
    }


def decode_step(data: dict[str, Any]) -> EnvStep:
    info: dict[str, Any] = dict(data.get("info", {}))
    if "final_observation" in info:
        info["final_observation"] = decode_observation(info["final_observation"])
    return EnvStep(
        observation=decode_observation(data["observation"]),
        reward=np.asarray(data["reward"], np.float32),
        terminated=np.asarray(data["terminated"], bool),
        truncated=np.asarray(data["truncated"], bool),
        success=np.asarray(data["success"], bool),
        info=info,
    )
