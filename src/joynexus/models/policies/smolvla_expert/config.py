"""Config of the SmolVLA action-expert family (``action_module.type: smolvla_expert``)."""

from __future__ import annotations

from typing import Literal

from joynexus.errors import SpecError
from joynexus.models.archs.smolvlm.resident import SmolVLAResident
from joynexus.models.policies.flow import PrefixExpertConfig
from joynexus.models.schema import DataSchema
from joynexus.models.types import describe_base, extension_of

SMOLVLA_EXPERT_NEEDS = "action_module type 'smolvla_expert'"


def smolvla_of(base: object, *, what: str) -> SmolVLAResident:
    """The SmolVLA checkpoint a SmolVLA resident base model hands ``what``.

    Raises:
        SpecError: the base model is not a SmolVLA checkpoint.
    """
    resident = extension_of(base, SmolVLAResident)
    if resident is None:
        raise SpecError(
            f"{what} needs a LeRobot SmolVLA base model (a smolvla policy directory, or "
            f"lerobot/smolvla_base); the resident base model {describe_base(base)}",
            field="action_module.type",
        )
    return resident


class SmolVLAExpertConfig(PrefixExpertConfig):
    """A tenant's copy of a SmolVLA checkpoint's action expert and projections."""

    type: Literal["smolvla_expert"] = "smolvla_expert"

    def check_base(self, base: object, schema: DataSchema) -> None:
        smolvla_of(base, what=SMOLVLA_EXPERT_NEEDS).check_schema(schema)
