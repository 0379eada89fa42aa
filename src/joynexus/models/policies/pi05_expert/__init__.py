"""π0.5 policy family: a tenant-private copy of a LeRobot π0.5 checkpoint's action
expert — a Gemma whose RMS norms are modulated by the flow time — attending to the
resident PaliGemma prefix's KV cache (``config``, ``module``)."""

from joynexus.models.policies.base import PolicyFamily
from joynexus.models.policies.pi05_expert.config import Pi05ExpertConfig, pi05_checkpoint_of
from joynexus.models.policies.pi05_expert.module import Pi05Expert, build_pi05_expert

FAMILY = PolicyFamily(Pi05ExpertConfig, build_pi05_expert)

__all__ = ["FAMILY", "Pi05Expert", "Pi05ExpertConfig", "pi05_checkpoint_of"]
