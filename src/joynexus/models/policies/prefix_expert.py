"""What the action experts of pretrained VLA checkpoints share (π0, SmolVLA).

Such an expert denoises a whole padded chunk ``[chunk_size, max_action_dim]`` (the
checkpoint's sizes) conditioned on a resident prefix's KV cache and the padded state, in
π0's time convention: ``t = 1`` is pure noise, ``t = 0`` the action chunk;
``x_t = t·noise + (1 − t)·actions``; the expert regresses ``noise − actions``; sampling
Euler-integrates from ``t = 1`` to ``t = 0`` in ``num_inference_steps`` steps of
``−1/N``. Training times are ``Beta(α, 1)·scale + offset`` from the checkpoint's config.

A tenant's schema may be narrower than the checkpoint: state and actions are
zero-padded, a chunk shorter than ``chunk_size`` fills the first steps, and the loss
counts only the tenant's own steps and dims.

:class:`PrefixFlowExpert` holds all of that once — the flow-matching loss, the sampler
and the Flow-SDE hooks of :class:`~joynexus.models.policies.flow.FlowSDEPolicy` (RL) —
and a family supplies only its :meth:`~PrefixFlowExpert.velocity` and the sizes. The
Flow-SDE's time runs the other way (``t = 0`` noise, velocity ``a − ε``): its velocity
is ``v(x, t) = −u(x, 1 − t)`` with ``u`` the expert's, so ``η → 0`` is exactly the
sampler; a chain covers the whole padded chunk (the padded entries condition the
expert) and its log-probability counts the tenant's own entries only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from joynexus.models.policies.base import expand_mask, features_as
from joynexus.models.policies.flow import (
    FlowSDEPolicy,
    VelocityFn,
    flow_matching_loss,
    repeat_rows,
)
from joynexus.models.types import BackboneOutput


class PrefixFlowExpert(FlowSDEPolicy):
    """A pretrained checkpoint's action expert as a tenant's flow policy.

    A subclass sets, in its ``__init__``: ``expert_config`` (with ``sde_noise_level``),
    ``chunk_size``, ``max_action_dim``, ``max_state_dim``, ``num_inference_steps``, the
    time distribution's ``_beta_alpha`` / ``_time_scale`` / ``_time_offset``, an
    ``action_out_proj`` linear layer, and implements :meth:`velocity`.
    """

    expert_config: Any
    chunk_size: int
    max_action_dim: int
    max_state_dim: int
    num_inference_steps: int
    _beta_alpha: float
    _time_scale: float
    _time_offset: float
    action_out_proj: torch.nn.Linear

    def velocity(
        self,
        features: BackboneOutput,
        padded_state: torch.Tensor,
        x: torch.Tensor,
        t: torch.Tensor,
    ) -> torch.Tensor:
        """The expert's velocity ``[B, chunk_size, max_action_dim]`` at ``x`` and ``t``
        (``padded_state`` ``[B, max_state_dim]``, ``t`` ``[B]`` float32)."""
        raise NotImplementedError

    def _pad_state(self, state: torch.Tensor) -> torch.Tensor:
        return F.pad(state, (0, self.max_state_dim - state.shape[-1]))

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
        return float(self.expert_config.sde_noise_level)

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
                images=None if features.images is None else repeat_rows(features.images, repeat),
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
