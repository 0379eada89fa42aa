"""OFT policy family: an MLP-ResNet regressing the whole chunk (L1), a diagonal Gaussian
policy for RL (OpenVLA-OFT recipe)."""

from joynexus.models.policies.base import PolicyFamily
from joynexus.models.policies.oft.config import OFTHeadConfig
from joynexus.models.policies.oft.module import OFTHead, build_oft_head

FAMILY = PolicyFamily(OFTHeadConfig, build_oft_head)

__all__ = ["FAMILY", "OFTHead", "OFTHeadConfig"]
