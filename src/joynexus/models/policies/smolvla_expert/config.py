"""Config of the SmolVLA action-expert family (``action_module.type: smolvla_expert``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from joynexus.models.policies.base import PolicyConfig
from joynexus.models.policies.flow import check_flow_rl
from joynexus.models.policies.smolvla_expert.resident import smolvla_of
from joynexus.models.schema import DataSchema

SMOLVLA_EXPERT_NEEDS = "action_module type 'smolvla_expert'"


class SmolVLAExpertConfig(PolicyConfig):
    """A tenant's copy of a SmolVLA checkpoint's action expert and projections."""

    type: Literal["smolvla_expert"] = "smolvla_expert"
    init: Literal["pretrained", "random"] = Field(
        default="pretrained",
        description="Start from the checkpoint's expert weights, or re-initialise them.",
    )
    num_inference_steps: int | None = Field(
        default=None, ge=1, le=1000, description="Denoising steps; default: the checkpoint's."
    )
    sde_noise_level: float = Field(
        default=0.5,
        gt=0,
        le=4.0,
        description="Flow-SDE noise level η of RL sampling (mode 'sample'); see "
        "models.policies.flow.",
    )

    def check_base(self, base: object, schema: DataSchema) -> None:
        smolvla_of(base, what=SMOLVLA_EXPERT_NEEDS).check_schema(schema)

    def check_rl(self, *, entropy_coef: float) -> None:
        check_flow_rl(self.type, self.num_inference_steps, entropy_coef=entropy_coef)
