"""Config of the π0 action-expert family (``action_module.type: pi0_expert``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from joynexus.errors import SpecError
from joynexus.models.archs.lerobot_pi.checkpoint import Pi0LeRobotCheckpoint
from joynexus.models.archs.paligemma.pi0 import Pi0Checkpoint
from joynexus.models.lora import LoRAConfig
from joynexus.models.policies.flow import PrefixExpertConfig
from joynexus.models.schema import DataSchema
from joynexus.models.types import describe_base, extension_of

PI0_EXPERT_NEEDS = "action_module type 'pi0_expert'"


def pi0_checkpoint_of(base: object, *, what: str) -> Pi0Checkpoint:
    """The π0 checkpoint a π0 resident base model hands ``what`` (its extension).

    Raises:
        SpecError: the base model is not a π0 policy.
    """
    pi0 = extension_of(base, Pi0Checkpoint)
    if pi0 is None:
        raise SpecError(
            f"{what} needs a π0 base model (tiny:pi0, or a PI0ForConditionalGeneration "
            f"checkpoint); the resident base model {describe_base(base)}",
            field="action_module.type",
        )
    return pi0


def pi0_resident_of(base: object, *, what: str) -> Pi0Checkpoint | Pi0LeRobotCheckpoint:
    """The π0 checkpoint a π0 resident hands ``what``: transformers' π0
    (:class:`Pi0Checkpoint`) or a LeRobot ``pi0`` directory (:class:`Pi0LeRobotCheckpoint`).

    Raises:
        SpecError: the base model is neither.
    """
    lerobot = extension_of(base, Pi0LeRobotCheckpoint)
    if lerobot is not None:
        return lerobot
    pi0 = extension_of(base, Pi0Checkpoint)
    if pi0 is None:
        raise SpecError(
            f"{what} needs a π0 base model (tiny:pi0, a PI0ForConditionalGeneration "
            f"checkpoint or a LeRobot pi0 policy directory); the resident base model "
            f"{describe_base(base)}",
            field="action_module.type",
        )
    return pi0


class Pi0ExpertConfig(PrefixExpertConfig):
    """A π0 action expert on a π0 base model (``action_module.type: pi0_expert``)."""

    # The base model is transformers' π0 or a LeRobot ``pi0`` directory: the resident
    # decides which expert a tenant gets (build_pi0_expert). The docstring above is the
    # API schema's description (docs/openapi.json), kept as it is.

    type: Literal["pi0_expert"] = "pi0_expert"
    lora: LoRAConfig | None = Field(
        default=None,
        description="Optional tenant LoRA adapter on the shared prefix's language model.",
    )

    def check_base(self, base: object, schema: DataSchema) -> None:
        pi0_resident_of(base, what=PI0_EXPERT_NEEDS).check_schema(schema)
