"""GR00T-style flow-matching action head: a small DiT that cross-attends to backbone features.

Time convention (used by the loss and the sampler alike):

* ``t ∈ [0, 1]``; ``t = 0`` is pure Gaussian noise, ``t = 1`` is the data (the action
  chunk).
* The noisy chunk is the straight-line interpolation ``x_t = (1 − t)·noise + t·actions``.
* The network regresses the constant velocity of that line, ``v = actions − noise``,
  with an MSE loss over valid action entries.
* Sampling integrates ``dx/dt = v(x_t, t)`` from ``t = 0`` (noise) to ``t = 1`` with
  ``num_inference_steps`` explicit Euler steps of size ``1/N``.

For RL the same network is a stochastic policy through Flow-SDE
(:mod:`joynexus.models.policies.flow`): :meth:`FlowMatchingHead.sample` draws a
chain of Gaussian denoising steps (``sde_noise_level``) and returns its log-probability,
:meth:`FlowMatchingHead.log_prob` recomputes it from the recorded chain.

Training times are drawn either uniformly or, as GR00T does, skewed towards the noisy
end: ``t = s·(1 − u)`` with ``u ~ Beta(1.5, 1)`` and ``s = 0.999``.

The sequence the DiT sees is ``[state token, action tokens...]``; backbone tokens enter
only as cross-attention memory under their attention mask, so padding added by a
grouped batch never changes the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from joynexus.models.policies.base import PolicyHead, features_as
from joynexus.models.policies.flow import (
    FlowSDEPolicy,
    VelocityFn,
    flow_matching_loss,
    repeat_rows,
)
from joynexus.models.policies.flow_matching.config import FlowMatchingHeadConfig
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput

_BETA_ALPHA = 1.5
_NOISE_S = 0.999


def timestep_embedding(t: torch.Tensor, dim: int, scale: float) -> torch.Tensor:
    """Sinusoidal embedding ``[B]`` → ``[B, dim]`` of continuous times."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10000.0) * torch.arange(half, device=t.device, dtype=t.dtype) / max(half, 1)
    )
    args = (t * scale).unsqueeze(-1) * freqs
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


class _Attention(nn.Module):
    """Multi-head attention over ``memory`` with an optional key mask (True = attend)."""

    def __init__(self, width: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(width, width)
        # No key bias: it shifts every score of a query equally, so softmax ignores it
        # and its gradient is pure rounding noise that Adam would amplify.
        self.k = nn.Linear(width, width, bias=False)
        self.v = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, key_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, n, w = x.shape
        h = self.num_heads
        q = self.q(x).view(b, n, h, w // h).transpose(1, 2)
        m = memory.shape[1]
        k = self.k(memory).view(b, m, h, w // h).transpose(1, 2)
        v = self.v(memory).view(b, m, h, w // h).transpose(1, 2)
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        out: torch.Tensor = self.out(y.transpose(1, 2).reshape(b, n, w))
        return out


class _DiTBlock(nn.Module):
    """Self-attention over state+action tokens, cross-attention to the backbone, MLP.

    Each sub-layer is pre-normed with a LayerNorm whose scale/shift (and the residual
    gate) come from the timestep embedding (adaLN), as in DiT.
    """

    def __init__(self, width: int, num_heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False)
        self.self_attn = _Attention(width, num_heads)
        self.norm2 = nn.LayerNorm(width)
        self.cross_attn = _Attention(width, num_heads)
        self.norm3 = nn.LayerNorm(width, elementwise_affine=False)
        self.mlp = nn.Sequential(
            nn.Linear(width, width * mlp_ratio), nn.GELU(), nn.Linear(width * mlp_ratio, width)
        )
        self.ada = nn.Linear(width, 6 * width)
        # Zero-init the modulation so every block starts as the identity (DiT's adaLN-Zero).
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(
        self,
        x: torch.Tensor,
        t_emb: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
    ) -> torch.Tensor:
        modulation: torch.Tensor = self.ada(F.silu(t_emb))
        shift1, scale1, gate1, shift3, scale3, gate3 = modulation.unsqueeze(1).chunk(6, dim=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        x = x + gate1 * self.self_attn(h, h)
        cross: torch.Tensor = self.cross_attn(self.norm2(x), memory, memory_mask)
        x = x + cross
        h = self.norm3(x) * (1 + scale3) + shift3
        mlp_out: torch.Tensor = self.mlp(h)
        return x + gate3 * mlp_out


@dataclass(frozen=True)
class FlowConditioning:
    """What the velocity reads besides ``(x_t, t)``, computed once per observation.

    Attributes:
        memory: ``[B, L, w]`` projected backbone tokens (cross-attention memory).
        memory_mask: ``[B, L]`` bool, True = attend.
        state_token: ``[B, 1, w]`` encoded robot state, or None without state.
    """

    memory: torch.Tensor
    memory_mask: torch.Tensor
    state_token: torch.Tensor | None

    def repeat(self, times: int) -> FlowConditioning:
        """Each row repeated ``times`` times in place (for a whole chain in one call)."""
        return FlowConditioning(
            repeat_rows(self.memory, times),
            repeat_rows(self.memory_mask, times),
            None if self.state_token is None else repeat_rows(self.state_token, times),
        )


class FlowMatchingHead(FlowSDEPolicy):
    """Flow-matching DiT action expert (see the module docstring for the time convention).

    Args:
        config: Head hyperparameters.
        hidden_size: Backbone feature width ``D``.
        state_dim, action_dim, action_chunk: The tenant schema's dims.
    """

    def __init__(
        self,
        config: FlowMatchingHeadConfig,
        *,
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
        self.config = config
        w = config.hidden_dim
        self.memory_proj = nn.Sequential(nn.LayerNorm(hidden_size), nn.Linear(hidden_size, w))
        self.state_encoder: nn.Module | None = (
            nn.Sequential(nn.Linear(state_dim, w), nn.SiLU(), nn.Linear(w, w))
            if state_dim > 0
            else None
        )
        self.time_mlp = nn.Sequential(nn.Linear(w, w), nn.SiLU(), nn.Linear(w, w))
        # Action encoder: per-step action projection fused with the timestep (GR00T style).
        self.action_in = nn.Linear(action_dim, w)
        self.action_fuse = nn.Sequential(nn.Linear(2 * w, w), nn.SiLU(), nn.Linear(w, w))
        self.action_pos = nn.Parameter(torch.randn(action_chunk, w) * 0.02)
        self.blocks = nn.ModuleList(
            _DiTBlock(w, config.num_heads, config.mlp_ratio) for _ in range(config.num_layers)
        )
        self.out_norm = nn.LayerNorm(w, elementwise_affine=False)
        self.out_ada = nn.Linear(w, 2 * w)
        nn.init.zeros_(self.out_ada.weight)
        nn.init.zeros_(self.out_ada.bias)
        self.out_proj = nn.Linear(w, action_dim)

    def condition(self, features: BackboneOutput, state: torch.Tensor) -> FlowConditioning:
        """The per-observation inputs of the velocity (memory and state token)."""
        features = features_as(features, self)
        memory = self.memory_proj(features.hidden_states)
        memory_mask = features.attention_mask.bool()
        # A row without any valid token would make softmax NaN; let it attend to all.
        memory_mask = memory_mask | ~memory_mask.any(dim=-1, keepdim=True)
        state_token = (
            None
            if self.state_encoder is None
            else self.state_encoder(state.to(memory)).unsqueeze(1)
        )
        return FlowConditioning(memory, memory_mask, state_token)

    def conditioned_velocity(
        self, cond: FlowConditioning, noisy_actions: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """Predicted velocity ``[B, chunk, A]`` under precomputed conditioning."""
        t_emb = self.time_mlp(
            timestep_embedding(t, self.config.hidden_dim, self.config.timestep_scale)
        )
        a = self.action_in(noisy_actions)
        a = self.action_fuse(torch.cat([a, t_emb.unsqueeze(1).expand_as(a)], dim=-1))
        tokens = a + self.action_pos
        if cond.state_token is not None:
            tokens = torch.cat([cond.state_token, tokens], dim=1)
        for block in self.blocks:
            tokens = block(tokens, t_emb, cond.memory, cond.memory_mask)
        shift, scale = self.out_ada(F.silu(t_emb)).unsqueeze(1).chunk(2, dim=-1)
        tokens = self.out_norm(tokens) * (1 + scale) + shift
        out: torch.Tensor = self.out_proj(tokens[:, -self.action_chunk :])
        return out

    def velocity(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        noisy_actions: torch.Tensor,
        t: torch.Tensor,
    ) -> torch.Tensor:
        """Predicted velocity ``[B, chunk, A]`` at ``noisy_actions`` and times ``t [B]``."""
        return self.conditioned_velocity(self.condition(features, state), noisy_actions, t)

    def sample_times(
        self,
        batch: int,
        *,
        device: torch.device,
        dtype: torch.dtype,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """Training times ``[B]`` under the configured distribution."""
        u = torch.rand(batch, generator=generator, device=device, dtype=dtype)
        if self.config.time_sampling == "uniform":
            return u
        # Beta(α, 1) by inverse CDF (its CDF is x^α), then flip towards the noisy end.
        beta = u.pow(1.0 / _BETA_ALPHA)
        return _NOISE_S * (1.0 - beta)

    def loss(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """MSE between predicted and true velocity over valid action entries."""
        self.check_inputs(features, state, actions)
        features = features_as(features, self)
        ref = self.out_proj.weight
        actions = actions.to(ref)
        noise = torch.randn(actions.shape, generator=generator, device=ref.device, dtype=ref.dtype)
        t = self.sample_times(
            actions.shape[0], device=ref.device, dtype=ref.dtype, generator=generator
        )
        cond = self.condition(features, state.to(ref))
        return flow_matching_loss(
            lambda x, tt: self.conditioned_velocity(cond, x, tt),
            actions,
            noise,
            t,
            action_mask,
            mask_inputs=True,
        )

    def _start_noise(self, batch: int, generator: torch.Generator | None) -> torch.Tensor:
        ref = self.out_proj.weight
        return torch.randn(
            (batch, self.action_chunk, self.action_dim),
            generator=generator,
            device=ref.device,
            dtype=ref.dtype,
        )

    @torch.no_grad()
    def predict(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        num_steps: int | None = None,
    ) -> torch.Tensor:
        """Euler-integrate the ODE from noise (t=0) to an action chunk (t=1)."""
        self.check_inputs(features, state)
        ref = self.out_proj.weight
        b = features.hidden_states.shape[0]
        steps = num_steps or self.config.num_inference_steps
        x = self._start_noise(b, generator)
        cond = self.condition(features, state.to(ref))
        dt = 1.0 / steps
        for k in range(steps):
            t = torch.full((b,), k * dt, device=ref.device, dtype=ref.dtype)
            x = x + dt * self.conditioned_velocity(cond, x, t)
        return x

    # --- Flow-SDE policy (RL): the hooks of FlowSDEPolicy ------------------------------

    def sde_steps(self) -> int:
        return self.config.num_inference_steps

    def sde_noise_level(self) -> float:
        return self.config.sde_noise_level

    def sde_reference(self) -> torch.Tensor:
        return self.out_proj.weight

    def sde_velocity(
        self, features: BackboneOutput, state: torch.Tensor, repeat: int
    ) -> VelocityFn:
        # The conditioning is computed once per observation, then repeated per step.
        cond = self.condition(features, state)
        if repeat > 1:
            cond = cond.repeat(repeat)
        return lambda x, t: self.conditioned_velocity(cond, x, t)


def build_flow_matching_head(
    config: FlowMatchingHeadConfig, hidden_size: int, schema: DataSchema, base: object
) -> PolicyHead:
    """A fresh :class:`FlowMatchingHead` for ``schema`` on a backbone of width ``hidden_size``."""
    return FlowMatchingHead(
        config,
        hidden_size=hidden_size,
        state_dim=schema.state_dim,
        action_dim=schema.action_dim,
        action_chunk=schema.action_chunk,
    )
