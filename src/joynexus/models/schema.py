"""Tenant data schemas and the signatures derived from them.

A :class:`DataSchema` describes what one tenant's robot sees and does: its cameras,
state and action dimensions, action-chunk length and control rate. Two signatures are
derived from it:

* :func:`schema_signature` identifies a tenant's *model-facing interface* (base model,
  camera slots at canonical resolution, state/action dims, chunk length). Training
  jobs, queue samples and checkpoints carry it so nothing is ever trained or served
  against the wrong interface.
* :func:`prefix_key` is coarser: only what the shared frozen backbone sees (base model,
  number of camera slots, canonical resolution). Requests with equal prefix keys may
  share one backbone forward even when their tenants' action spaces differ — this is
  the compatibility key of group batching (paper §4.3, Appendix A.3).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CameraSpec(BaseModel):
    """One camera's image shape, H×W×C, uint8 RGB."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    height: int = Field(gt=0, le=4096)
    width: int = Field(gt=0, le=4096)
    channels: int = Field(default=3, ge=1, le=4)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)


class DataSchema(BaseModel):
    """The observation/action interface of one tenant's robot.

    Camera order is significant: the i-th camera fills the backbone's i-th camera slot.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="custom", min_length=1, max_length=64)
    cameras: dict[str, CameraSpec] = Field(min_length=1)
    state_dim: int = Field(ge=0, le=1024)
    action_dim: int = Field(gt=0, le=1024)
    action_chunk: int = Field(default=1, gt=0, le=256)
    fps: float = Field(default=10.0, gt=0)
    instruction: str = Field(default="", max_length=2048)

    @model_validator(mode="after")
    def _camera_names_are_identifiers(self) -> DataSchema:
        for cam in self.cameras:
            if not cam or not cam.replace("_", "").replace(".", "").isalnum():
                raise ValueError(
                    f"camera name {cam!r} must be non-empty and use only letters, digits, "
                    "'_' and '.'"
                )
        return self

    @property
    def camera_names(self) -> list[str]:
        return list(self.cameras)


def _digest(payload: dict[str, Any]) -> str:
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def schema_signature(schema: DataSchema, *, base_model_id: str, canonical_image_size: int) -> str:
    """Deterministic id of a tenant's model-facing interface.

    Same interface → same signature across processes and machines (it hashes a
    canonical JSON form, never Python object ids). The tenant-facing ``name``,
    ``fps`` and default ``instruction`` are deliberately excluded: they do not change
    what the model computes on.

    Args:
        schema: The tenant's data schema.
        base_model_id: The resident base model's id (hub id or path as configured).
        canonical_image_size: Side of the square image every camera is resized to.
    """
    return "sig-" + _digest(
        {
            "base_model": base_model_id,
            "camera_slots": len(schema.cameras),
            "canonical_image_size": canonical_image_size,
            "state_dim": schema.state_dim,
            "action_dim": schema.action_dim,
            "action_chunk": schema.action_chunk,
        }
    )


def prefix_key(*, base_model_id: str, num_camera_slots: int, canonical_image_size: int) -> str:
    """Compatibility key of the shared frozen prefix (what the backbone sees)."""
    return "prefix-" + _digest(
        {
            "base_model": base_model_id,
            "camera_slots": num_camera_slots,
            "canonical_image_size": canonical_image_size,
        }
    )


# Presets mirroring the LeRobot-format datasets the paper trains on (§5.2) and the
# simulators this project ships adapters for.
LIBERO = DataSchema(
    name="libero",
    cameras={
        "image": CameraSpec(height=256, width=256),
        "wrist_image": CameraSpec(height=256, width=256),
    },
    state_dim=8,
    action_dim=7,
    action_chunk=8,
    fps=10.0,
)
CALVIN = DataSchema(
    name="calvin",
    cameras={
        "rgb_static": CameraSpec(height=200, width=200),
        "rgb_gripper": CameraSpec(height=84, width=84),
    },
    state_dim=15,
    action_dim=7,
    action_chunk=8,
    fps=15.0,
)
PUSHT = DataSchema(
    name="pusht",
    cameras={"top": CameraSpec(height=96, width=96)},
    state_dim=2,
    action_dim=2,
    action_chunk=8,
    fps=10.0,
    instruction="Push the T-shaped block onto the target.",
)
METAWORLD = DataSchema(
    name="metaworld",
    cameras={"corner": CameraSpec(height=224, width=224)},
    state_dim=39,
    action_dim=4,
    action_chunk=4,
    fps=80.0,
)

PRESETS: dict[str, DataSchema] = {s.name: s for s in (LIBERO, CALVIN, PUSHT, METAWORLD)}
