"""Flow-matching policy family: a GR00T-style DiT cross-attending to the backbone,
trained by flow matching, a Flow-SDE policy for RL."""

from joynexus.models.policies.base import PolicyFamily
from joynexus.models.policies.flow_matching.config import FlowMatchingHeadConfig
from joynexus.models.policies.flow_matching.module import FlowMatchingHead, build_flow_matching_head

FAMILY = PolicyFamily(FlowMatchingHeadConfig, build_flow_matching_head)

__all__ = ["FAMILY", "FlowMatchingHead", "FlowMatchingHeadConfig"]
