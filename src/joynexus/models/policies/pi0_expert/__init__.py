"""π0 policy family: a tenant-private π0 action expert attending to the resident
PaliGemma prefix's KV cache (``config``/``module``: the tenant's expert on transformers'
π0; ``lerobot``: on a LeRobot ``pi0`` directory — the resident decides which)."""

from joynexus.models.archs.paligemma.pi0 import PI0_MODEL_TYPE, Pi0Checkpoint
from joynexus.models.policies.base import PolicyFamily
from joynexus.models.policies.pi0_expert.config import (
    Pi0ExpertConfig,
    pi0_checkpoint_of,
    pi0_resident_of,
)
from joynexus.models.policies.pi0_expert.lerobot import LeRobotPi0Expert
from joynexus.models.policies.pi0_expert.module import Pi0Expert, build_pi0_expert

FAMILY = PolicyFamily(Pi0ExpertConfig, build_pi0_expert)

__all__ = [
    "FAMILY",
    "PI0_MODEL_TYPE",
    "LeRobotPi0Expert",
    "Pi0Checkpoint",
    "Pi0Expert",
    "Pi0ExpertConfig",
    "pi0_checkpoint_of",
    "pi0_resident_of",
]
