"""msgpack encoding of env observations and steps (remote env protocol).

numpy arrays travel as a msgpack extension (dtype, shape, raw bytes); the codec itself
(:func:`packb` / :func:`unpackb`, with its validation) lives in :mod:`joynexus.wire` and
is shared with the HTTP API.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from joynexus.envs.base import EnvObservation, EnvStep
from joynexus.wire import packb, unpackb

__all__ = [
    "decode_observation",
    "decode_step",
    "encode_observation",
    "encode_step",
    "packb",
    "unpackb",
]


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
