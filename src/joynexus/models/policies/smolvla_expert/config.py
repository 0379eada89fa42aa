"""Config of the SmolVLA action-expert family (``action_module.type: smolvla_expert``)."""

from __future__ import annotations

from typing import Literal

from joynexus.models.policies.flow import PrefixExpertConfig
from joynexus.models.policies.smolvla_expert.resident import smolvla_of
from joynexus.models.schema import DataSchema

SMOLVLA_EXPERT_NEEDS = "action_module type 'smolvla_expert'"


class SmolVLAExpertConfig(PrefixExpertConfig):
    """A tenant's copy of a SmolVLA checkpoint's action expert and projections."""

    type: Literal["smolvla_expert"] = "smolvla_expert"

    def check_base(self, base: object, schema: DataSchema) -> None:
        smolvla_of(base, what=SMOLVLA_EXPERT_NEEDS).check_schema(schema)
