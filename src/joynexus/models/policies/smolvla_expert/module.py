"""A tenant's private SmolVLA action expert over the resident SmolVLA prefix.

What a tenant owns — and trains — is everything of the checkpoint that is not the
vision-language prefix: the action expert (``lm_expert``, the narrower Llama-style
transformer), the action input/output projections, the action-time MLP, and
``state_proj`` (the state token's projection into the prefix). Each starts as a copy of
the checkpoint's (``init: pretrained``). The frozen prefix is the resident's, never
copied: the expert extends the shared cache by its own state token through the frozen
text layers (gradients reach ``state_proj`` through them) and then denoises over it.

Loss, sampler and RL (Flow-SDE) are
:class:`~joynexus.models.policies.prefix_expert.PrefixFlowExpert`'s; this module supplies
the velocity and the checkpoint's names (:meth:`SmolVLAExpert.expert_state`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from joynexus.models.archs.smolvlm.resident import (
    TIME_BETA_ALPHA,
    TIME_OFFSET,
    TIME_SCALE,
    SmolVLAResident,
)
from joynexus.models.lora import LoRAAdapter, LoRARows, LoRASegment, lora_rows
from joynexus.models.policies.base import PolicyHead
from joynexus.models.policies.prefix_expert import PrefixFlowExpert
from joynexus.models.policies.smolvla_expert.config import (
    SMOLVLA_EXPERT_NEEDS,
    SmolVLAExpertConfig,
    smolvla_of,
)
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput

#: The tenant's projections, named as in the checkpoint under ``model.``.
PROJECTIONS = (
    "state_proj",
    "action_in_proj",
    "action_out_proj",
    "action_time_mlp_in",
    "action_time_mlp_out",
)
EXPERT_KEY_PREFIX = "model.vlm_with_expert."
PROJECTION_KEY_PREFIX = "model."


def lerobot_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A tenant expert's tensors (by :class:`SmolVLAExpert`'s names) under the names a
    LeRobot SmolVLA checkpoint gives them."""
    prefix = {"lm_expert": EXPERT_KEY_PREFIX}
    return {
        prefix.get(key.split(".", 1)[0], PROJECTION_KEY_PREFIX) + key: value
        for key, value in state.items()
    }


class _Resident:
    """The resident checkpoint, held by reference: not a submodule (a tenant's state
    dict and parameters are its own), and not copied with the tenant's module (a frozen
    reference policy shares the one prefix too)."""

    def __init__(self, resident: SmolVLAResident):
        self.resident = resident

    def __deepcopy__(self, memo: dict[int, Any]) -> _Resident:
        return self


class _Adapter:
    """The tenant's LoRA adapter, held by reference: the slot owns, trains and saves it
    (not a submodule of the expert); a frozen reference copy of the expert shares it."""

    def __init__(self, adapter: LoRAAdapter | None):
        self.adapter = adapter

    def __deepcopy__(self, memo: dict[int, Any]) -> _Adapter:
        return self


class SmolVLAExpert(PrefixFlowExpert):
    """A SmolVLA checkpoint's action expert and projections as one tenant's module.

    Raises:
        SpecError: the schema is wider or longer than the checkpoint allows.
    """

    # Copies of the checkpoint's modules (set by name from PROJECTIONS).
    state_proj: nn.Linear
    action_in_proj: nn.Linear
    action_time_mlp_in: nn.Linear
    action_time_mlp_out: nn.Linear

    def __init__(
        self,
        config: SmolVLAExpertConfig,
        *,
        resident: SmolVLAResident,
        hidden_size: int,
        state_dim: int,
        action_dim: int,
        action_chunk: int,
    ):
        super().__init__(
            hidden_size=hidden_size,
            state_dim=state_dim,
            action_dim=action_dim,
            action_chunk=action_chunk,
        )
        resident.check_dims(
            "tenant", state_dim=state_dim, action_dim=action_dim, action_chunk=action_chunk
        )
        self.expert_config = config
        self._host = _Resident(resident)
        self._lora = _Adapter(None)
        ckpt = resident.ckpt
        self.chunk_size = ckpt.chunk_size
        self.max_action_dim = ckpt.max_action_dim
        self.max_state_dim = ckpt.max_state_dim
        self.num_inference_steps = config.num_inference_steps or ckpt.num_steps
        self._beta_alpha, self._time_scale, self._time_offset = (
            TIME_BETA_ALPHA,
            TIME_SCALE,
            TIME_OFFSET,
        )
        source = resident.model.model
        for name in PROJECTIONS:
            setattr(self, name, copy.deepcopy(getattr(source, name)))
        self.lm_expert: nn.Module = copy.deepcopy(resident.model.core.lm_expert)
        if config.init == "random":
            for module in self.modules():
                reset = getattr(module, "reset_parameters", None)
                if module is not self and callable(reset):
                    reset()
        # Copies of frozen modules: the tenant trains them, in fp32.
        self.float().requires_grad_(True)

    def use_lora(self, adapter: LoRAAdapter | None) -> None:
        self._lora = _Adapter(adapter)

    @property
    def resident(self) -> SmolVLAResident:
        return self._host.resident

    # --- the checkpoint's names ------------------------------------------------------

    def expert_state(self) -> dict[str, torch.Tensor]:
        """The tenant's tensors under their LeRobot SmolVLA names."""
        return lerobot_names(dict(self.state_dict()))

    # --- compute ---------------------------------------------------------------------

    def velocity(
        self,
        features: BackboneOutput,
        padded_state: torch.Tensor,
        x: torch.Tensor,
        t: torch.Tensor,
    ) -> torch.Tensor:
        if features.prefix_kv is None:
            raise ValueError(
                "smolvla_expert needs the SmolVLA prefix cache (BackboneOutput.prefix_kv); "
                "the base model did not produce one"
            )
        model = self.resident.model
        dtype = self.resident.dtype
        # The state token goes through the resident's frozen layers in their dtype.
        token = self.state_proj(padded_state).to(dtype)
        shared = [(k.to(dtype), v.to(dtype)) for k, v in features.prefix_kv]
        # The state token is the last token of SmolVLA's prefix: it goes through the
        # tenant's adapted text layers, as in the checkpoint its LoRA is merged into.
        adapter = self._lora.adapter
        rows = int(token.shape[0])
        assignment = (
            None
            if adapter is None
            else LoRARows(rows, (LoRASegment(0, rows, adapter),), training=self.training)
        )
        with lora_rows(assignment):
            cache, pad = model.with_state(
                shared, features.attention_mask.bool(), padded_state, state_proj=lambda _: token
            )
        cache = [(k.to(x.dtype), v.to(x.dtype)) for k, v in cache]
        return model.velocity(cache, pad, x, t, head=self)


def build_smolvla_expert(
    config: SmolVLAExpertConfig, hidden_size: int, schema: DataSchema, base: object
) -> PolicyHead:
    """A tenant's expert from the resident SmolVLA checkpoint.

    Raises:
        SpecError: no SmolVLA base model, or a schema that does not fit its checkpoint.
    """
    return SmolVLAExpert(
        config,
        resident=smolvla_of(base, what=SMOLVLA_EXPERT_NEEDS),
        hidden_size=hidden_size,
        state_dim=schema.state_dim,
        action_dim=schema.action_dim,
        action_chunk=schema.action_chunk,
    )
