"""Tenant-private action modules (paper §3.1): OFT MLP head, flow-matching DiT, π0 action
expert, value head.

Use :func:`build_action_module` with a :data:`HeadConfig` (discriminated on ``type``)
rather than constructing heads by hand, so a workload spec can name its head in YAML.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from joynexus.models.heads.base import ActionModule, masked_mean, masked_reduce
from joynexus.models.heads.flow_matching import FlowMatchingHead, FlowMatchingHeadConfig
from joynexus.models.heads.oft import OFTHead, OFTHeadConfig
from joynexus.models.heads.pi0_expert import Pi0Expert, Pi0ExpertConfig
from joynexus.models.heads.value import ValueHead, ValueHeadConfig
from joynexus.models.pi0 import pi0_checkpoint_of
from joynexus.models.schema import DataSchema

AnyHeadConfig = OFTHeadConfig | FlowMatchingHeadConfig | Pi0ExpertConfig
HeadConfig = Annotated[AnyHeadConfig, Field(discriminator="type")]
"""Config of any action module; ``type`` picks the head ("oft", "flow_matching" or
"pi0_expert")."""


def build_action_module(
    config: AnyHeadConfig,
    *,
    hidden_size: int,
    schema: DataSchema,
    base: object = None,
) -> ActionModule:
    """A freshly initialised action module sized for ``schema`` and the backbone width.

    ``base`` is the resident base model: a ``pi0_expert`` starts from its π0
    checkpoint's expert.

    Raises:
        SpecError: a ``pi0_expert`` without a π0 base model, or a schema that does not
            fit its checkpoint.
    """
    dims = {
        "hidden_size": hidden_size,
        "state_dim": schema.state_dim,
        "action_dim": schema.action_dim,
        "action_chunk": schema.action_chunk,
    }
    if isinstance(config, OFTHeadConfig):
        return OFTHead(config, **dims)
    if isinstance(config, Pi0ExpertConfig):
        pi0 = pi0_checkpoint_of(base, what="action_module type 'pi0_expert'")
        return Pi0Expert(config, pi0=pi0, **dims)
    return FlowMatchingHead(config, **dims)


__all__ = [
    "ActionModule",
    "AnyHeadConfig",
    "FlowMatchingHead",
    "FlowMatchingHeadConfig",
    "HeadConfig",
    "OFTHead",
    "OFTHeadConfig",
    "Pi0Expert",
    "Pi0ExpertConfig",
    "ValueHead",
    "ValueHeadConfig",
    "build_action_module",
    "masked_mean",
    "masked_reduce",
]
