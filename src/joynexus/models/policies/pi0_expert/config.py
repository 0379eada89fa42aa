"""Config of the π0 action-expert family (``action_module.type: pi0_expert``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from joynexus.models.lora import LoRAConfig
from joynexus.models.policies.base import PolicyConfig
from joynexus.models.policies.flow import check_flow_rl
from joynexus.models.policies.pi0_expert.checkpoint import pi0_checkpoint_of
from joynexus.models.schema import DataSchema

PI0_EXPERT_NEEDS = "action_module type 'pi0_expert'"


class Pi0ExpertConfig(PolicyConfig):
    """A π0 action expert on a π0 base model (``action_module.type: pi0_expert``)."""

    type: Literal["pi0_expert"] = "pi0_expert"
    init: Literal["pretrained", "random"] = Field(
        default="pretrained",
        description="Start from the checkpoint's expert weights, or from a fresh init.",
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
    lora: LoRAConfig | None = Field(
        default=None,
        description="Optional tenant LoRA adapter on the shared prefix's language model.",
    )

    def check_base(self, base: object, schema: DataSchema) -> None:
        pi0_checkpoint_of(base, what=PI0_EXPERT_NEEDS).check_schema(schema)

    def check_rl(self, *, entropy_coef: float) -> None:
        check_flow_rl(self.type, self.num_inference_steps, entropy_coef=entropy_coef)
