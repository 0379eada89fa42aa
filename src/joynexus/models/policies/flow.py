"""The flow-matching loss and Flow-SDE, shared by every flow policy family.

:func:`flow_matching_loss` is the one supervised loss of the flow families (the DiT head
and the π0 expert differ only in their time convention and what they mask).

Flow-SDE: a flow-matching policy as a chain of Gaussian steps, so PPO and GRPO apply.

A flow-matching head samples an action chunk by integrating a learned velocity from
Gaussian noise to data. That ODE is deterministic given its start, so the action has no
tractable density. Flow-SDE (as in Flow-GRPO and π_RL) replaces each Euler step by an
Euler–Maruyama step of an SDE with the same marginals; every denoising step is then a
Gaussian with a mean computed by the network, and the log-probability of a sampled chain
is the sum of its steps' Gaussian log-densities. This module holds that math for ANY
flow head: it only sees a velocity function ``v(x_t, t)`` with the conditioning (backbone
features, state, a prefix KV cache...) closed over, so the DiT head and a π0 action
expert plug in the same way.

Conventions (those of :mod:`joynexus.models.policies.flow_matching`):

* ``t ∈ [0, 1]``; ``t = 0`` is pure noise, ``t = 1`` the action chunk;
  ``x_t = (1 − t)·ε + t·a`` and the network regresses ``v = a − ε``.
* ``K`` steps on the grid ``t_k = k / K`` (``k = 0 … K−1``), ``dt = 1 / K``.

The SDE. Given ``x_t``, the noise is ``ε = x_t − t·v``, so the score of the
interpolation's marginal is ``∇log p_t(x) = −(x − t·v) / (1 − t)``. For any diffusion
``σ(t)`` the SDE ``dx = [v + ½σ²·∇log p_t] dt + σ dW`` has the ODE's marginals. We take
``σ(t)² = η²·(1 − t)`` (``η`` = ``noise_level``): the ``1/(1 − t)`` of the score cancels,
nothing diverges, and the injected noise fades to ``η·dt`` at the last step, so the
final action is not blurred by a large last-step noise. One step::

    mean_k = x_k + dt·[v_k − ½η²·(x_k − t_k·v_k)]        v_k = v(x_k, t_k)
    std_k  = η·sqrt((1 − t_k)·dt)
    x_{k+1} = mean_k + std_k·z,  z ~ N(0, I)

``log π(chain) = Σ_k log N(x_{k+1}; mean_k, std_k²)`` over the chunk's (valid) entries.
The start ``x_0 ~ N(0, I)`` does not depend on the weights, so its density is left out
(it cancels in every importance ratio). ``η = 0`` is the deterministic Euler ODE.

What a rollout records: the whole chain ``[B, K+1, chunk, A]`` (``x_0 … x_K``; ``x_K``
is the action the policy output in model units). With it the actor recomputes the exact
log-probability under its current weights (the ratio is exactly 1 at the behaviour
weights: same inputs, same arithmetic). Memory: ``(K + 1)·chunk·A`` float32 per sample
(e.g. 10 steps × chunk 8 × 7 dims = 2.4 KB), bounded by :data:`MAX_RL_FLOW_STEPS`.

Entropy: each step's std is fixed by the schedule, so the chain's conditional entropy
does not depend on the weights; there is no entropy bonus to take (exploration is set
by ``noise_level``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Literal

import torch
from pydantic import Field

from joynexus.errors import SchemaMismatchError
from joynexus.models.policies.base import (
    PolicyConfig,
    PolicyGaussians,
    PolicyHead,
    PolicySample,
    expand_mask,
    masked_reduce,
)
from joynexus.models.types import BackboneOutput

VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``v(x_t [B, chunk, A], t [B]) -> [B, chunk, A]``: a flow head's velocity, with its
conditioning (features, state, KV cache) closed over."""

MAX_RL_FLOW_STEPS = 64
"""Most denoising steps an RL-trained flow head may take: the rollout records
``steps + 1`` chunks per sample and the actor re-runs every step with grad."""

FLOW_CHAIN = "flow_chain"
"""The partition field a flow policy's rollouts record (its Flow-SDE chains)."""

_LOG_2PI = math.log(2.0 * math.pi)


def flow_matching_loss(
    velocity: VelocityFn,
    actions: torch.Tensor,
    noise: torch.Tensor,
    t: torch.Tensor,
    weights: torch.Tensor | None,
    *,
    noise_at_one: bool = False,
    mask_inputs: bool = False,
) -> torch.Tensor:
    """Flow-matching MSE between the predicted and the true velocity over valid entries.

    The noisy chunk is the straight line between ``noise`` and ``actions`` at ``t``; the
    velocity regressed is that line's constant slope.

    Args:
        velocity: The head's velocity ``v(x_t, t)`` with its conditioning closed over.
        actions: ``[B, chunk, A]`` targets (already padded to the head's chunk).
        noise: ``[B, chunk, A]`` Gaussian noise.
        t: ``[B]`` training times (passed to ``velocity`` as given).
        weights: Mask broadcastable to ``actions`` (1 = the entry counts), or None.
        noise_at_one: π0's convention: ``t = 1`` is noise, ``x_t = t·ε + (1 − t)·a``,
            target ``ε − a``; else GR00T's: ``t = 0`` is noise, ``x_t = (1 − t)·ε + t·a``,
            target ``a − ε``.
        mask_inputs: Zero the masked-out entries of ``x_t`` too, so padded entries do not
            leak their (meaningless) values into the velocity of valid ones.
    """
    tb = t[:, None, None].to(actions.dtype)
    if noise_at_one:
        noisy = tb * noise + (1.0 - tb) * actions
        target = noise - actions
    else:
        noisy = (1.0 - tb) * noise + tb * actions
        target = actions - noise
    if mask_inputs and weights is not None:
        noisy = noisy * expand_mask(weights, noisy)
    return masked_reduce((velocity(noisy, t) - target).pow(2), weights)


def check_flow_rl(kind: str, steps: int | None, *, entropy_coef: float) -> None:
    """Refuse what Flow-SDE RL cannot honour rather than ignore it (spec validation).

    Raises:
        ValueError: more denoising steps than :data:`MAX_RL_FLOW_STEPS`, or an entropy
            bonus (the SDE's noise schedule is fixed, so the bonus would do nothing).
    """
    if steps is not None and steps > MAX_RL_FLOW_STEPS:
        raise ValueError(
            f"rl with a {kind!r} head records every denoising step of each "
            f"sample and the actor re-runs them all; action_module.num_inference_steps "
            f"must be <= {MAX_RL_FLOW_STEPS} for rl, got {steps}"
        )
    if entropy_coef > 0:
        raise ValueError(
            f"algorithm.entropy_coef must be 0 with a {kind!r} head: its Flow-SDE "
            "steps have a fixed noise schedule, so the policy's entropy does not depend "
            "on the weights and a bonus would do nothing; set exploration with "
            "action_module.sde_noise_level"
        )


def step_times(steps: int, *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The grid ``t_k = k / steps`` for ``k = 0 … steps − 1`` (``[steps]``)."""
    return torch.arange(steps, device=device, dtype=dtype) / steps


def sde_step(
    x: torch.Tensor, t: float | torch.Tensor, v: torch.Tensor, *, dt: float, noise_level: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of one Flow-SDE step from ``x`` at time ``t`` with velocity ``v``.

    Returns:
        ``(mean [B, chunk, A], std)`` where ``std`` is a scalar tensor (one per step).
    """
    t_tensor = torch.as_tensor(t, device=x.device, dtype=x.dtype)
    half_var = 0.5 * noise_level**2
    mean = x + dt * (v - half_var * (x - t_tensor * v))
    std = noise_level * torch.sqrt((1.0 - t_tensor) * dt)
    return mean, std


def gaussian_log_density(
    x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Sum over the masked entries of ``log N(x; mean, std²)`` per row: ``[B, ...]`` → ``[B]``."""
    z = (x - mean) / std
    per_entry = -0.5 * z.pow(2) - torch.log(std) - 0.5 * _LOG_2PI
    if mask is not None:
        per_entry = per_entry * mask
    return per_entry.flatten(1).sum(dim=-1)


def sample_chain(
    velocity: VelocityFn,
    x0: torch.Tensor,
    *,
    steps: int,
    noise_level: float,
    generator: torch.Generator | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample a Flow-SDE chain from ``x0`` and return it with its log-probability.

    Args:
        velocity: The head's velocity function.
        x0: ``[B, chunk, A]`` starting noise.
        steps: Number of denoising steps ``K`` (≥ 1).
        noise_level: ``η`` > 0.
        generator: Source of the step noise (a tenant's own generator).
        mask: Optional ``[B, chunk, A]`` mask of the entries that count (1 = valid).

    Returns:
        ``(chain [B, K+1, chunk, A], log_prob [B])``; ``chain[:, -1]`` is the action.

    Raises:
        ValueError: ``steps`` < 1 or ``noise_level`` ≤ 0 (no density to give).
    """
    _check(steps, noise_level)
    dt = 1.0 / steps
    b = x0.shape[0]
    times = step_times(steps, device=x0.device, dtype=x0.dtype)
    x = x0
    chain = [x0]
    log_prob = torch.zeros(b, device=x0.device, dtype=x0.dtype)
    for k in range(steps):
        t = times[k]
        mean, std = sde_step(x, t, velocity(x, t.expand(b)), dt=dt, noise_level=noise_level)
        z = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        x = mean + std * z
        chain.append(x)
        log_prob = log_prob + gaussian_log_density(x, mean, std, mask)
    return torch.stack(chain, dim=1), log_prob


def chain_gaussians(
    velocity: VelocityFn,
    chain: torch.Tensor,
    *,
    noise_level: float,
    mask: torch.Tensor | None = None,
) -> PolicyGaussians:
    """The ``K`` Gaussian steps ``N(mean_k, std_k²)`` of a recorded chain under
    ``velocity`` (with grad): ``mean`` ``[B, K, chunk, A]``, ``sample`` ``x_1 … x_K``.

    All ``K`` steps run as ONE batched velocity call over ``B·K`` rows (the states
    ``x_0 … x_{K−1}`` are known), so recomputing costs one forward, not ``K``.

    Args:
        velocity: The head's velocity function; it is called with ``B·K`` rows, the
            ``K`` steps of row ``i`` at rows ``i·K … i·K + K − 1`` (see
            :func:`repeat_rows` for the conditioning).
        chain: ``[B, K+1, chunk, A]`` as returned by :func:`sample_chain`.
        noise_level: The ``η`` the chain was sampled with.
        mask: Optional ``[B, chunk, A]`` (or broadcastable) mask of valid entries.

    Raises:
        SchemaMismatchError: ``chain`` is not ``[B, K+1, chunk, A]`` with ``K`` ≥ 1.
        ValueError: ``noise_level`` ≤ 0.
    """
    if chain.dim() != 4 or chain.shape[1] < 2:
        raise SchemaMismatchError(
            f"flow_chain: expected [B, steps + 1, chunk, action_dim] with steps >= 1, "
            f"got {list(chain.shape)}",
            field="flow_chain",
        )
    b, k1 = chain.shape[:2]
    steps = k1 - 1
    _check(steps, noise_level)
    dt = 1.0 / steps
    times = step_times(steps, device=chain.device, dtype=chain.dtype)
    x = chain[:, :-1]  # [B, K, chunk, A]
    flat_x = x.reshape(b * steps, *chain.shape[2:])
    flat_t = times.repeat(b)
    v = velocity(flat_x, flat_t).reshape(x.shape)
    mean, std = sde_step(x, times[None, :, None, None], v, dt=dt, noise_level=noise_level)
    step_mask = None if mask is None else mask.unsqueeze(1).expand_as(x).to(x)
    return PolicyGaussians(chain[:, 1:], mean, std.expand_as(mean), step_mask)


def chain_log_prob(
    velocity: VelocityFn,
    chain: torch.Tensor,
    *,
    noise_level: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probability ``[B]`` of a recorded chain under ``velocity`` (with grad): the
    density of its steps under :func:`chain_gaussians` (same arguments and errors)."""
    steps = chain_gaussians(velocity, chain, noise_level=noise_level, mask=mask)
    return gaussian_log_density(steps.sample, steps.mean, steps.std, steps.mask)


def repeat_rows(tensor: torch.Tensor, times: int) -> torch.Tensor:
    """Each row of ``tensor`` repeated ``times`` times in place (row ``i`` → rows
    ``i·times … i·times + times − 1``): conditioning for :func:`chain_log_prob`."""
    return tensor.repeat_interleave(times, dim=0)


def _check(steps: int, noise_level: float) -> None:
    if steps < 1:
        raise ValueError(f"a flow chain needs at least one step, got {steps}")
    if not noise_level > 0:
        raise ValueError(
            f"Flow-SDE needs noise_level > 0 to give log-probabilities, got {noise_level}"
        )


class FlowSDEPolicy(PolicyHead):
    """Flow-SDE RL for a flow-matching head: :meth:`sample` records a chain, and
    :meth:`log_prob` recomputes its log-probability under the current weights.

    A family supplies only what differs between flow heads: how many steps and how much
    noise (:meth:`sde_steps`, :meth:`sde_noise_level`), the shape of one chain state
    (:meth:`sde_chain_shape`, which may be wider than the tenant's schema), the starting
    noise, the velocity in this module's time convention with its conditioning repeated
    per chain step (:meth:`sde_velocity`), the entries that count (:meth:`sde_mask`) and
    how a chain's last state becomes the tenant's actions (:meth:`sde_actions`).
    """

    rl_fields = (FLOW_CHAIN,)

    # --- what a family supplies --------------------------------------------------------

    def sde_steps(self) -> int:
        """Denoising steps of an RL sample."""
        raise NotImplementedError

    def sde_noise_level(self) -> float:
        """The Flow-SDE ``η``."""
        raise NotImplementedError

    def sde_reference(self) -> torch.Tensor:
        """A weight whose device and dtype the chain takes."""
        raise NotImplementedError

    def sde_chain_shape(self) -> tuple[int, int]:
        """``(chunk, width)`` of one chain state."""
        return (self.action_chunk, self.action_dim)

    def sde_velocity(
        self, features: BackboneOutput, state: torch.Tensor, repeat: int
    ) -> VelocityFn:
        """The velocity over ``B·repeat`` rows (row ``i``'s conditioning repeated
        ``repeat`` times in place, see :func:`repeat_rows`)."""
        raise NotImplementedError

    def sde_mask(
        self, batch: int, ref: torch.Tensor, action_mask: torch.Tensor | None
    ) -> torch.Tensor | None:
        """``[B, *chain_shape]`` entries that count (None: all of them)."""
        if action_mask is None:
            return None
        return expand_mask(action_mask, ref.new_zeros((batch, *self.sde_chain_shape())))

    def sde_actions(self, last: torch.Tensor) -> torch.Tensor:
        """The tenant's actions ``[B, chunk, A]`` from a chain's last state."""
        return last

    # --- the RL policy -------------------------------------------------------------------

    @torch.no_grad()
    def sample(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> PolicySample:
        """Draw a Flow-SDE chain: ``(actions [B, chunk, A], log_prob [B], chain)``.

        ``chain`` is ``[B, steps + 1, *chain_shape]``; a rollout records it so
        :meth:`log_prob` can recompute the log-probability.

        Raises:
            SchemaMismatchError: inputs that do not fit the head.
            ValueError: more denoising steps than :data:`MAX_RL_FLOW_STEPS`.
        """
        self.check_inputs(features, state)
        steps = self.sde_steps()
        if steps > MAX_RL_FLOW_STEPS:
            raise ValueError(
                f"RL sampling records every denoising step; num_inference_steps {steps} is "
                f"above {MAX_RL_FLOW_STEPS}"
            )
        ref = self.sde_reference()
        b = features.batch_size
        start = torch.randn(
            (b, *self.sde_chain_shape()), generator=generator, device=ref.device, dtype=ref.dtype
        )
        chain, log_prob = sample_chain(
            self.sde_velocity(features, state.to(ref), 1),
            start,
            steps=steps,
            noise_level=self.sde_noise_level(),
            generator=generator,
            mask=self.sde_mask(b, ref, None),
        )
        return PolicySample(self.sde_actions(chain[:, -1]), log_prob, chain)

    def rl_log_prob(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        fields: Mapping[str, torch.Tensor],
    ) -> torch.Tensor:
        """The recorded chain's Flow-SDE log-probability (the actions are its last step)."""
        return self.log_prob(features, state, fields[FLOW_CHAIN])

    def rl_gaussians(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        fields: Mapping[str, torch.Tensor],
    ) -> PolicyGaussians:
        """The recorded chain's Flow-SDE steps as Gaussians (see :meth:`chain_steps`)."""
        return self.chain_steps(features, state, fields[FLOW_CHAIN])

    def log_prob(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        chain: torch.Tensor,
        action_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Log-probability ``[B]`` of recorded chains under the current weights (with grad);
        arguments and errors as :meth:`chain_steps`."""
        steps = self.chain_steps(features, state, chain, action_mask)
        return gaussian_log_density(steps.sample, steps.mean, steps.std, steps.mask)

    def chain_steps(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        chain: torch.Tensor,
        action_mask: torch.Tensor | None = None,
    ) -> PolicyGaussians:
        """The Flow-SDE steps of recorded chains under the current weights (with grad):
        the Gaussians :meth:`log_prob` sums the density of.

        Args:
            features: Backbone output of the chains' observations.
            state: ``[B, state_dim]``.
            chain: ``[B, steps + 1, *chain_shape]`` from :meth:`sample`.
            action_mask: Optional mask broadcastable to the tenant's ``[B, chunk, A]``;
                masked-out entries contribute nothing.

        Raises:
            SchemaMismatchError: a chain of another shape than this head samples.
        """
        self.check_inputs(features, state)
        ref = self.sde_reference()
        chain = chain.to(ref)
        b = features.batch_size
        shape = self.sde_chain_shape()
        if chain.dim() != 4 or (chain.shape[0], *chain.shape[2:]) != (b, *shape):
            raise SchemaMismatchError(
                f"flow_chain: expected [{b}, steps + 1, {shape[0]}, {shape[1]}], got "
                f"{list(chain.shape)}",
                field="flow_chain",
            )
        steps = int(chain.shape[1]) - 1
        return chain_gaussians(
            self.sde_velocity(features, state.to(ref), steps),
            chain,
            noise_level=self.sde_noise_level(),
            mask=self.sde_mask(b, ref, action_mask),
        )


class PrefixExpertConfig(PolicyConfig):
    """What every family of a checkpoint's own flow expert (π0, SmolVLA) configures."""

    init: Literal["pretrained", "random"] = Field(
        default="pretrained",
        description="Start from the checkpoint's expert weights, or re-initialise them.",
    )
    num_inference_steps: int | None = Field(
        default=None, ge=1, le=1000, description="Denoising steps; default: the checkpoint's."
    )
    sde_noise_level: float = Field(
        default=0.5,
        gt=0,
        le=4.0,
        description="Flow-SDE noise level η of RL sampling (mode 'sample'); see "
        "models.policies.flow.",
    )

    def check_rl(self, *, entropy_coef: float) -> None:
        check_flow_rl(self.type, self.num_inference_steps, entropy_coef=entropy_coef)
