"""Config of the π0 action-expert family (``action_module.type: pi0_expert``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from joynexus.models.lora import LoRAConfig
from joynexus.models.policies.flow import PrefixExpertConfig
from joynexus.models.policies.pi0_expert.checkpoint import pi0_checkpoint_of
from joynexus.models.schema import DataSchema

PI0_EXPERT_NEEDS = "action_module type 'pi0_expert'"


class Pi0ExpertConfig(PrefixExpertConfig):
    """A π0 action expert on a π0 base model (``action_module.type: pi0_expert``)."""

    type: Literal["pi0_expert"] = "pi0_expert"
    lora: LoRAConfig | None = Field(
        default=None,
        description="Optional tenant LoRA adapter on the shared prefix's language model.",
    )

    def check_base(self, base: object, schema: DataSchema) -> None:
        pi0_checkpoint_of(base, what=PI0_EXPERT_NEEDS).check_schema(schema)
