"""SmolVLA policy family: a tenant-private copy of a LeRobot SmolVLA checkpoint's action
expert and projections over the resident SmolVLA prefix (``resident``: the checkpoint as
the base model; ``config``/``module``: the tenant's expert; ``export``: a tenant back out
as a LeRobot policy directory, imported on demand)."""

from joynexus.models.archs.smolvlm.resident import SmolVLAResident
from joynexus.models.policies.base import PolicyFamily
from joynexus.models.policies.smolvla_expert.config import SmolVLAExpertConfig, smolvla_of
from joynexus.models.policies.smolvla_expert.module import SmolVLAExpert, build_smolvla_expert

FAMILY = PolicyFamily(SmolVLAExpertConfig, build_smolvla_expert)

__all__ = ["FAMILY", "SmolVLAExpert", "SmolVLAExpertConfig", "SmolVLAResident", "smolvla_of"]
