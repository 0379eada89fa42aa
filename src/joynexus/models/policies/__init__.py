"""Tenant-private policy heads as plug-ins (paper §3.1), one folder per family.

* :mod:`~joynexus.models.policies.base`: the :class:`PolicyHead` contract and
  :class:`PolicyConfig`, shared tensor helpers;
* :mod:`~joynexus.models.policies.registry`: families by ``type``; :data:`HeadConfig`
  parses a spec's ``action_module``, :func:`build_action_module` builds it;
* :mod:`~joynexus.models.policies.flow`: the flow-matching loss and Flow-SDE, shared by
  the flow families;
* families: ``oft/`` (MLP-ResNet, Gaussian policy), ``flow_matching/`` (DiT),
  ``pi0_expert/`` (π0 action expert on a π0 base, with its checkpoint split and export);
* :mod:`~joynexus.models.policies.value`: the RL critic a slot may carry next to any head.
"""

from __future__ import annotations

from joynexus.models.policies.base import (
    ActionModule,
    PolicyConfig,
    PolicyFamily,
    PolicyGaussians,
    PolicyHead,
    PolicySample,
    masked_mean,
    masked_reduce,
)
from joynexus.models.policies.flow_matching import FlowMatchingHead, FlowMatchingHeadConfig
from joynexus.models.policies.oft import OFTHead, OFTHeadConfig
from joynexus.models.policies.pi0_expert import Pi0Expert, Pi0ExpertConfig
from joynexus.models.policies.registry import (
    HeadConfig,
    build_action_module,
    policy_types,
    register_policy,
    unregister_policy,
)
from joynexus.models.policies.value import ValueHead, ValueHeadConfig

__all__ = [
    "ActionModule",
    "FlowMatchingHead",
    "FlowMatchingHeadConfig",
    "HeadConfig",
    "OFTHead",
    "OFTHeadConfig",
    "Pi0Expert",
    "Pi0ExpertConfig",
    "PolicyConfig",
    "PolicyFamily",
    "PolicyGaussians",
    "PolicyHead",
    "PolicySample",
    "ValueHead",
    "ValueHeadConfig",
    "build_action_module",
    "masked_mean",
    "masked_reduce",
    "policy_types",
    "register_policy",
    "unregister_policy",
]
