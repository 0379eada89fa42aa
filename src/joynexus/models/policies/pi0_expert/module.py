"""A tenant's private π0 action expert, attending to the shared PaliGemma prefix KV cache.

The module holds exactly the expert half of ``transformers``' ``PI0ForConditionalGeneration``
under the same names (``model.dit``, ``embed_action_time``, ``action_out_proj``) and runs
``transformers``' own forward code on it, with the prefix cache coming from the resident
backbone (:attr:`~joynexus.models.types.BackboneOutput.prefix_kv`). So a tenant's expert
computes what the checkpoint's expert computes, and exports back into a complete
checkpoint key for key (:func:`joynexus.models.policies.pi0_expert.export.export_pi0`).

π0's time convention (kept as is): ``t = 1`` is pure noise, ``t = 0`` the action chunk;
``x_t = t·noise + (1 − t)·actions``; the expert regresses ``noise − actions``; sampling
Euler-integrates from ``t = 1`` to ``t = 0`` in ``num_inference_steps`` steps of ``−1/N``.
Training times are ``Beta(α, 1)·scale + offset`` from the checkpoint's config.

The tenant's schema may be narrower than the checkpoint: state and actions are zero-padded
to ``max_state_dim`` / ``max_action_dim``, a chunk shorter than ``chunk_size`` fills the
first steps, and the loss counts only the tenant's own steps and dims.

RL (:meth:`Pi0Expert.sample`, :meth:`Pi0Expert.log_prob`) is the head-agnostic Flow-SDE of
:mod:`joynexus.models.policies.flow`, whose time runs the other way (``t = 0`` noise,
velocity ``a − ε``): its velocity is ``v(x, t) = −u(x, 1 − t)`` with ``u`` this expert's,
so ``η → 0`` is exactly the sampler above. A chain covers the whole padded chunk
``[steps + 1, chunk_size, max_action_dim]`` (the padded entries condition the expert);
its log-probability counts the tenant's own entries only, the padded ones being noise
the reward never sees.
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from joynexus.models.policies.base import PolicyHead, expand_mask, features_as
from joynexus.models.policies.flow import (
    FlowSDEPolicy,
    VelocityFn,
    flow_matching_loss,
    repeat_rows,
)
from joynexus.models.policies.pi0_expert.checkpoint import (
    EXPERT_EMBED_KEY,
    Pi0Checkpoint,
    hf_pi0,
    pi0_checkpoint_of,
)
from joynexus.models.policies.pi0_expert.config import PI0_EXPERT_NEEDS, Pi0ExpertConfig
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput


class _Pi0Suffix(nn.Module):
    """``PI0Model`` without its VLM: transformers' suffix path (the expert over a given
    prefix cache). ``PI0Model.forward`` reads only ``config`` and ``dit`` when it gets a
    cache and no pixels, which is all this module has."""

    def __init__(self, config: Any, dit: nn.Module):
        super().__init__()
        self.config = config
        self.dit = dit

    def forward(self, **kwargs: Any) -> Any:
        return hf_pi0().PI0Model.forward(self, **kwargs)


class Pi0Expert(FlowSDEPolicy):
    """The action expert of a π0 checkpoint as one tenant's action module.

    Args:
        config: The tenant's expert settings.
        pi0: The resident π0 checkpoint (architecture and pretrained weights).
        hidden_size, state_dim, action_dim, action_chunk: The backbone width and the
            tenant schema's dims.

    Raises:
        SpecError: the schema is wider or longer than the checkpoint allows.
    """

    def __init__(
        self,
        config: Pi0ExpertConfig,
        *,
        pi0: Pi0Checkpoint,
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
        pi0.check_dims(
            "tenant", state_dim=state_dim, action_dim=action_dim, action_chunk=action_chunk
        )
        hf_config = pi0.config
        self.expert_config = config
        # ``config`` is what transformers' forward code reads (the PI0Config).
        self.config = hf_config
        self.chunk_size = pi0.chunk_size
        self.max_action_dim = pi0.max_action_dim
        self.max_state_dim = pi0.max_state_dim
        self.num_inference_steps = config.num_inference_steps or pi0.num_inference_steps
        self._beta_alpha = float(hf_config.time_sampling_beta_alpha)
        self._time_scale = float(hf_config.time_sampling_scale)
        self._time_offset = float(hf_config.time_sampling_offset)
        hf = importlib.import_module("transformers")
        dit_config = copy.deepcopy(hf_config.dit_config)
        dit: Any = hf.AutoModel.from_config(dit_config)
        # The expert always gets embeddings, never token ids: no vocabulary table.
        dit.embed_tokens = None
        self.model = _Pi0Suffix(hf_config, dit)
        self.embed_action_time = hf_pi0().PI0ActionTimeEmbedding(hf_config)
        self.action_out_proj = nn.Linear(int(dit_config.hidden_size), self.max_action_dim)
        if config.init == "pretrained":
            state = {k: v for k, v in pi0.expert_state.items() if k != EXPERT_EMBED_KEY}
            self.load_state_dict(state, strict=True)

    # --- the checkpoint's names ------------------------------------------------------

    def expert_state(self) -> dict[str, torch.Tensor]:
        """The expert's tensors under their ``PI0ForConditionalGeneration`` names."""
        return dict(self.state_dict())

    # --- compute ---------------------------------------------------------------------

    def _pad_state(self, state: torch.Tensor) -> torch.Tensor:
        return F.pad(state, (0, self.max_state_dim - state.shape[-1]))

    def velocity(
        self,
        features: BackboneOutput,
        padded_state: torch.Tensor,
        x: torch.Tensor,
        t: torch.Tensor,
    ) -> torch.Tensor:
        """The expert's velocity ``[B, chunk_size, max_action_dim]`` at ``x`` and ``t``.

        Args:
            features: This tenant's rows of the prefix (with ``prefix_kv``).
            padded_state: ``[B, max_state_dim]``.
            x: ``[B, chunk_size, max_action_dim]`` noisy chunk.
            t: ``[B]`` times (float32).
        """
        if features.prefix_kv is None:
            raise ValueError(
                "pi0_expert needs the π0 prefix KV cache (BackboneOutput.prefix_kv); "
                "the base model did not produce one"
            )
        cache_utils = importlib.import_module("transformers.cache_utils")
        # A fresh cache per call: the expert's layers append their own keys and values,
        # which must never leak into the next denoising step (or another tenant).
        cache = cache_utils.DynamicCache(ddp_cache_data=list(features.prefix_kv))
        out = hf_pi0().PI0ForConditionalGeneration.forward(
            self,
            state=padded_state,
            noise=x,
            timestep=t,
            attention_mask=features.attention_mask,
            cache=cache,
        )
        velocity: torch.Tensor = out.logits
        return velocity

    def sample_times(
        self, batch: int, *, ref: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        """Training times ``[B]``: ``Beta(α, 1)`` by inverse CDF, scaled and offset."""
        u = torch.rand(batch, generator=generator, device=ref.device, dtype=torch.float32)
        return u.pow(1.0 / self._beta_alpha) * self._time_scale + self._time_offset

    def loss(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Flow-matching MSE over the tenant's own chunk steps and action dims."""
        self.check_inputs(features, state, actions)
        features = features_as(features, self)
        ref = self.action_out_proj.weight
        b = actions.shape[0]
        target = torch.zeros((b, self.chunk_size, self.max_action_dim), device=ref.device)
        target = target.to(ref.dtype)
        target[:, : self.action_chunk, : self.action_dim] = actions.to(ref)
        valid = torch.zeros_like(target)
        region = valid[:, : self.action_chunk, : self.action_dim]
        region.fill_(1.0)
        if action_mask is not None:
            region.mul_(expand_mask(action_mask, region))
        noise = torch.randn(target.shape, generator=generator, device=ref.device, dtype=ref.dtype)
        t = self.sample_times(b, ref=ref, generator=generator)
        padded = self._pad_state(state.to(ref))
        return flow_matching_loss(
            lambda x, tt: self.velocity(features, padded, x, tt),
            target,
            noise,
            t,
            valid,
            noise_at_one=True,
        )

    def initial_noise(
        self, batch: int, *, ref: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        """The sampler's starting point ``[B, chunk_size, max_action_dim]`` (t = 1)."""
        shape = (batch, self.chunk_size, self.max_action_dim)
        return torch.randn(shape, generator=generator, device=ref.device, dtype=ref.dtype)

    @torch.no_grad()
    def denoise(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        noise: torch.Tensor,
        *,
        num_steps: int | None = None,
    ) -> torch.Tensor:
        """Euler-integrate ``noise`` from t = 1 to t = 0, as ``sample_actions`` does.

        Returns:
            The full chunk ``[B, chunk_size, max_action_dim]`` (before cropping to the
            tenant's schema).
        """
        features = features_as(features, self)
        steps = num_steps or self.num_inference_steps
        x = noise
        padded = self._pad_state(state.to(x))
        dt = -1.0 / steps
        b = x.shape[0]
        for step in range(steps):
            t = torch.full((b,), 1.0 + step * dt, dtype=torch.float32, device=x.device)
            x = x + dt * self.velocity(features, padded, x, t)
        return x

    @torch.no_grad()
    def predict(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Sample an action chunk ``[B, action_chunk, action_dim]`` from fresh noise."""
        self.check_inputs(features, state)
        ref = self.action_out_proj.weight
        noise = self.initial_noise(features.batch_size, ref=ref, generator=generator)
        full = self.denoise(features, state, noise)
        return full[:, : self.action_chunk, : self.action_dim]

    # --- Flow-SDE policy (RL): the hooks of FlowSDEPolicy ------------------------------

    def sde_steps(self) -> int:
        return self.num_inference_steps

    def sde_noise_level(self) -> float:
        return self.expert_config.sde_noise_level

    def sde_reference(self) -> torch.Tensor:
        return self.action_out_proj.weight

    def sde_chain_shape(self) -> tuple[int, int]:
        # The whole padded chunk: the padded entries condition the expert.
        return (self.chunk_size, self.max_action_dim)

    def sde_velocity(
        self, features: BackboneOutput, state: torch.Tensor, repeat: int
    ) -> VelocityFn:
        """This expert's velocity in flow_policy's time convention (see the module doc)."""
        features = features_as(features, self)
        padded = self._pad_state(state)
        if repeat > 1:
            kv = features.prefix_kv
            features = BackboneOutput(
                hidden_states=repeat_rows(features.hidden_states, repeat),
                attention_mask=repeat_rows(features.attention_mask, repeat),
                prefix_kv=None
                if kv is None
                else tuple((repeat_rows(k, repeat), repeat_rows(v, repeat)) for k, v in kv),
            )
            padded = repeat_rows(padded, repeat)

        def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return -self.velocity(features, padded, x, (1.0 - t).float())

        return velocity

    def sde_mask(
        self, batch: int, ref: torch.Tensor, action_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """1 at the tenant's own steps and dims (times ``action_mask``), 0 at the padding."""
        mask = torch.zeros((batch, self.chunk_size, self.max_action_dim), device=ref.device)
        mask = mask.to(ref.dtype)
        own = mask[:, : self.action_chunk, : self.action_dim]
        own.fill_(1.0)
        if action_mask is not None:
            own.mul_(expand_mask(action_mask, own))
        return mask

    def sde_actions(self, last: torch.Tensor) -> torch.Tensor:
        return last[:, : self.action_chunk, : self.action_dim]


def build_pi0_expert(
    config: Pi0ExpertConfig, hidden_size: int, schema: DataSchema, base: object
) -> PolicyHead:
    """A tenant's expert from the resident π0 checkpoint (its expert for ``init: pretrained``).

    Raises:
        SpecError: no π0 base model, or a schema that does not fit its checkpoint.
    """
    return Pi0Expert(
        config,
        pi0=pi0_checkpoint_of(base, what=PI0_EXPERT_NEEDS),
        hidden_size=hidden_size,
        state_dim=schema.state_dim,
        action_dim=schema.action_dim,
        action_chunk=schema.action_chunk,
    )
