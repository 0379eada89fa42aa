"""How a tenant's served policy is reached from outside: the ``serving`` section of a spec.

Today one protocol has options: openpi's websocket policy protocol (``joynexus serve
--openpi-port``, :mod:`joynexus.server.openpi`). Its defaults are the observation keys
openpi's LIBERO example sends — ``observation/<camera>`` per schema camera,
``observation/state`` and ``prompt`` — so a LIBERO client connects unchanged; a robot
that sends other names (DROID: ``observation/exterior_image_1_left``,
``observation/joint_position`` + ``observation/gripper_position``) maps them here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["OpenPIServing", "ServingSpec"]

_Key = Field(min_length=1, max_length=256)


class OpenPIServing(BaseModel):
    """Observation keys and limits of the tenant's openpi websocket endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cameras: dict[str, str] | None = Field(
        default=None,
        description="Schema camera -> request key (default: 'observation/<camera>' each).",
    )
    state: list[str] | None = Field(
        default=None,
        max_length=32,
        description="Request keys whose values are concatenated, in order, into the state "
        "(default: ['observation/state']).",
    )
    prompt: str = Field(default="prompt", min_length=1, max_length=256)
    max_connections: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="Open openpi connections of this tenant at once; one more is refused.",
    )

    def camera_keys(self, cameras: list[str]) -> dict[str, str]:
        """Schema camera -> request key, defaults filled in."""
        given = self.cameras or {}
        return {cam: given.get(cam, f"observation/{cam}") for cam in cameras}

    def state_keys(self) -> list[str]:
        return list(self.state) if self.state is not None else ["observation/state"]


class ServingSpec(BaseModel):
    """Serving options of a workload's tenant."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    openpi: OpenPIServing = Field(default_factory=OpenPIServing)
