"""Tenant-private action modules (paper §3.1): OFT MLP head, flow-matching DiT, value head.

Use :func:`build_action_module` with a :data:`HeadConfig` (discriminated on ``type``)
rather than constructing heads by hand, so a workload spec can name its head in YAML.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from joynexus.models.heads.base import ActionModule, masked_mean, masked_reduce
from joynexus.models.heads.flow_matching import FlowMatchingHead, FlowMatchingHeadConfig
from joynexus.models.heads.oft import OFTHead, OFTHeadConfig
from joynexus.models.heads.value import ValueHead, ValueHeadConfig
from joynexus.models.schema import DataSchema

HeadConfig = Annotated[OFTHeadConfig | FlowMatchingHeadConfig, Field(discriminator="type")]
"""Config of any action module; ``type`` picks the head ("oft" or "flow_matching")."""


def build_action_module(
    config: OFTHeadConfig | FlowMatchingHeadConfig, *, hidden_size: int, schema: DataSchema
) -> ActionModule:
    """A freshly initialised action module sized for ``schema`` and the backbone width."""
    dims = {
        "hidden_size": hidden_size,
        "state_dim": schema.state_dim,
        "action_dim": schema.action_dim,
        "action_chunk": schema.action_chunk,
    }
    if isinstance(config, OFTHeadConfig):
        return OFTHead(config, **dims)
    return FlowMatchingHead(config, **dims)


__all__ = [
    "ActionModule",
    "FlowMatchingHead",
    "FlowMatchingHeadConfig",
    "HeadConfig",
    "OFTHead",
    "OFTHeadConfig",
    "ValueHead",
    "ValueHeadConfig",
    "build_action_module",
    "masked_mean",
    "masked_reduce",
]
