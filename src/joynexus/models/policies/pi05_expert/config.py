"""Config of the π0.5 action-expert family (``action_module.type: pi05_expert``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from joynexus.errors import SpecError
from joynexus.models.archs.lerobot_pi.checkpoint import Pi05Checkpoint
from joynexus.models.lora import LoRAConfig
from joynexus.models.policies.flow import PrefixExpertConfig
from joynexus.models.schema import DataSchema
from joynexus.models.types import describe_base, extension_of

PI05_EXPERT_NEEDS = "action_module type 'pi05_expert'"


def pi05_checkpoint_of(base: object, *, what: str) -> Pi05Checkpoint:
    """The π0.5 checkpoint a π0.5 resident base model hands ``what`` (its extension).

    Raises:
        SpecError: the base model is not a LeRobot π0.5 policy.
    """
    pi05 = extension_of(base, Pi05Checkpoint)
    if pi05 is None:
        raise SpecError(
            f"{what} needs a LeRobot π0.5 base model (a pi05 policy directory); the "
            f"resident base model {describe_base(base)}",
            field="action_module.type",
        )
    return pi05


class Pi05ExpertConfig(PrefixExpertConfig):
    """A tenant's copy of a π0.5 checkpoint's action expert (adaptive-norm Gemma) and
    its projections (``action_module.type: pi05_expert``)."""

    type: Literal["pi05_expert"] = "pi05_expert"
    lora: LoRAConfig | None = Field(
        default=None,
        description="Optional tenant LoRA adapter on the shared prefix's language model.",
    )

    def check_base(self, base: object, schema: DataSchema) -> None:
        pi05_checkpoint_of(base, what=PI05_EXPERT_NEEDS).check_schema(schema)
