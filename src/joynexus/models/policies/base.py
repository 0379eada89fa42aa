"""The contract every policy family fulfils, and shared tensor helpers.

A policy family is a config (:class:`PolicyConfig`, discriminated on ``type``) that
builds a tenant-private :class:`PolicyHead`. A head reads the frozen backbone's
:class:`BackboneOutput` (plus the tenant's own robot state) and produces an action chunk
``[B, chunk, action_dim]``. The backbone output may be a slice of a grouped batch that
is padded to a longer sequence than the tenant's own batch would be, so heads must
treat backbone tokens as an unordered, masked set: they pool or cross-attend under
``attention_mask`` and never use the position of a backbone token. That is what makes
grouped and serial execution compute the same loss.

Everything the services ask of a head goes through this contract (supervised loss,
prediction, rollout sampling, the RL log-probability and entropy, the rollout fields RL
needs, the resident base it needs) so no caller ever switches on a head's type; the
families are found by ``type`` in :mod:`joynexus.models.policies.registry`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, NamedTuple, TypeVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from joynexus.errors import SchemaMismatchError
from joynexus.models.lora import LoRAAdapter, LoRAConfig
from joynexus.models.policies.layers import module_layers, residual_mlp
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput


class PolicySample(NamedTuple):
    """Stochastic actions of one decode (:meth:`PolicyHead.sample`).

    Attributes:
        actions: ``[B, chunk, A]``.
        log_probs: ``[B]`` log-probability of each sample, or None (no density).
        chain: ``[B, steps + 1, chunk, A]`` Flow-SDE chain of a flow head (what the
            actor needs to recompute ``log_probs``), else None.
    """

    actions: torch.Tensor
    log_probs: torch.Tensor | None
    chain: torch.Tensor | None = None


class PolicyGaussians(NamedTuple):
    """A policy's density at recorded samples as a product of diagonal Gaussians
    (:meth:`PolicyHead.rl_gaussians`): ``log π = Σ log N(x; mean, std²)`` over the
    entries ``mask`` keeps. A Gaussian head is one Gaussian over the chunk; a Flow-SDE
    head one per denoising step, conditioned on the recorded chain.

    Attributes:
        sample: ``[B, ...]`` the recorded points the density is taken at (the actions;
            a flow head's chain states ``x_1 … x_K``).
        mean: Shaped as ``sample`` (with grad).
        std: Broadcastable to ``mean``.
        mask: Broadcastable to ``mean`` (1 = the entry counts), or None.
    """

    sample: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    mask: torch.Tensor | None


class PolicyHead(nn.Module, abc.ABC):
    """A tenant-private action head: backbone features + state → action chunk.

    Subclasses implement :meth:`loss` and :meth:`predict`; a head that RL can train also
    implements :meth:`sample` with a log-probability, :meth:`rl_log_prob` and (if its
    entropy depends on its weights) :meth:`entropy`, and names in :attr:`rl_fields`
    what its rollouts must record besides observations and actions.

    Attributes:
        hidden_size: Width ``D`` of the backbone features the module expects.
        state_dim: Width of the tenant's robot state (0 = no state).
        action_dim: Width of one action.
        action_chunk: Number of actions predicted per observation.
    """

    def __init__(self, *, hidden_size: int, state_dim: int, action_dim: int, action_chunk: int):
        super().__init__()
        if hidden_size <= 0 or action_dim <= 0 or action_chunk <= 0 or state_dim < 0:
            raise ValueError(
                "action module dims must be positive (state_dim may be 0): got "
                f"hidden_size={hidden_size}, state_dim={state_dim}, action_dim={action_dim}, "
                f"action_chunk={action_chunk}"
            )
        self.hidden_size = hidden_size
        self.state_dim = state_dim
        self.action_dim = action_dim
        self.action_chunk = action_chunk

    rl_fields: ClassVar[tuple[str, ...]] = ()
    """Partition fields :meth:`rl_log_prob` needs besides observations and actions (a
    rollout records them from :meth:`sample`)."""

    def group_key(self) -> Hashable | None:
        """Heads with equal keys decode their rows in one pass (:meth:`predict_group`,
        :meth:`sample_group`): the same family and layer shapes on the same device and
        dtype. ``None`` (the default): this head decodes alone."""
        return None

    @classmethod
    def predict_group(
        cls,
        heads: Sequence[PolicyHead],
        features: BackboneOutput,
        state: torch.Tensor,
        owner: Sequence[int],
    ) -> torch.Tensor:
        """:meth:`predict` of several tenants' heads of one :meth:`group_key` at once.

        Args:
            heads: The heads (equal, non-``None`` group keys).
            features: Every row of every head, ``[R, L, D]``.
            state: ``[R, state_dim]``, in the heads' device and dtype.
            owner: For each row, the index of the head that decodes it.

        Returns:
            ``[R, chunk, action_dim]``, row ``r`` equal to ``heads[owner[r]].predict``
            of it.
        """
        raise NotImplementedError(f"{cls.__name__} has no group_key: it predicts alone")

    @classmethod
    def sample_group(
        cls,
        heads: Sequence[PolicyHead],
        features: BackboneOutput,
        state: torch.Tensor,
        owner: Sequence[int],
        generators: Sequence[torch.Generator | None],
    ) -> PolicySample:
        """:meth:`sample` of several tenants' heads of one :meth:`group_key` at once.

        Args:
            heads, features, state, owner: As for :meth:`predict_group` (each head's
                rows contiguous, in head order).
            generators: Each head's generator, in head order: head ``k``'s rows draw
                from ``generators[k]`` exactly what ``heads[k].sample`` would.

        Returns:
            The group's actions and log-probabilities, row ``r`` as
            ``heads[owner[r]].sample`` gives it.
        """
        raise NotImplementedError(f"{cls.__name__} has no group_key: it samples alone")

    def use_lora(self, adapter: LoRAAdapter | None) -> None:
        """The tenant's backbone adapter, for a head that runs backbone layers itself
        (its tokens must see the tenant's adapted backbone too); most heads do not."""

    @abc.abstractmethod
    def loss(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Scalar supervised loss over valid action entries only.

        Args:
            features: Backbone output for this tenant's rows.
            state: ``[B, state_dim]`` robot state.
            actions: ``[B, chunk, action_dim]`` target actions.
            action_mask: Optional mask broadcastable to ``[B, chunk, action_dim]``;
                1/True marks an entry that counts (e.g. a real action dim, a chunk step
                inside the episode). ``None`` = every entry counts.
            generator: Source of randomness for stochastic losses (flow matching noise
                and time); a tenant passes its own so runs are reproducible.
        """

    @abc.abstractmethod
    def predict(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The action chunk ``[B, chunk, action_dim]`` for each observation."""

    # --- RL (defaults: a head without a policy density, sft and evaluation only) ------

    @property
    def supports_rl(self) -> bool:
        """Whether RL can train this head (it overrides :meth:`rl_log_prob`)."""
        return type(self).rl_log_prob is not PolicyHead.rl_log_prob

    @torch.no_grad()
    def sample(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> PolicySample:
        """Stochastic actions for a rollout with their log-probs; a head without a
        density returns its prediction and no log-probs."""
        return PolicySample(self.predict(features, state, generator=generator), None)

    def rl_log_prob(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        fields: Mapping[str, torch.Tensor],
    ) -> torch.Tensor:
        """Log-probabilities ``[B]`` of behaviour samples under the current weights (with
        grad); ``fields`` holds the recorded :attr:`rl_fields` (all present).

        Raises:
            NotImplementedError: the head has no policy density (see :attr:`supports_rl`).
        """
        raise NotImplementedError(f"{type(self).__name__} has no policy log-density")

    def rl_gaussians(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        fields: Mapping[str, torch.Tensor],
    ) -> PolicyGaussians:
        """The Gaussians behind :meth:`rl_log_prob` at the same samples (with grad), so a
        KL to a reference policy (the RL anchor to the SFT policy) is exact, not sampled.

        Raises:
            NotImplementedError: the head has no Gaussian policy density.
        """
        raise NotImplementedError(f"{type(self).__name__} has no Gaussian policy density")

    def entropy(self) -> torch.Tensor | None:
        """The policy's entropy when it depends on the weights (an entropy bonus can act
        on it), else None."""
        return None

    def check_inputs(
        self, features: BackboneOutput, state: torch.Tensor, actions: torch.Tensor | None = None
    ) -> None:
        """Fail fast with the offending name and expected shape (instead of a matmul error).

        Raises:
            SchemaMismatchError: when a tensor does not fit this module.
        """
        hs = features.hidden_states
        b = hs.shape[0]
        if hs.dim() != 3 or hs.shape[-1] != self.hidden_size:
            raise SchemaMismatchError(
                f"features.hidden_states: expected [B, L, {self.hidden_size}], "
                f"got {list(hs.shape)}",
                field="features.hidden_states",
            )
        if tuple(features.attention_mask.shape) != tuple(hs.shape[:2]):
            raise SchemaMismatchError(
                f"features.attention_mask: expected {list(hs.shape[:2])}, "
                f"got {list(features.attention_mask.shape)}",
                field="features.attention_mask",
            )
        if tuple(state.shape) != (b, self.state_dim):
            raise SchemaMismatchError(
                f"state: expected [{b}, {self.state_dim}], got {list(state.shape)}",
                field="state",
            )
        if actions is not None:
            expected = (b, self.action_chunk, self.action_dim)
            if tuple(actions.shape) != expected:
                raise SchemaMismatchError(
                    f"actions: expected {list(expected)}, got {list(actions.shape)}",
                    field="actions",
                )


ActionModule = PolicyHead
"""The paper's name for a tenant-private head (§3.1); the same class."""


class PolicyConfig(BaseModel):
    """Config of one policy family; ``type`` names the family in a workload spec.

    A family subclasses this with ``type: Literal["<name>"]`` and its hyperparameters,
    and registers it with its builder as a :class:`PolicyFamily`
    (:func:`joynexus.models.policies.registry.register_policy`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    lora: LoRAConfig | None = None

    def check_base(self, base: object, schema: DataSchema) -> None:
        """Refuse (``SpecError``) a resident base model this family cannot run on, before
        any tenant state exists; by default any base will do."""

    def check_rl(self, *, entropy_coef: float) -> None:
        """Refuse (``ValueError``, read by spec validation) an RL setting this family
        cannot honour; by default every setting is honoured."""


C = TypeVar("C", bound=PolicyConfig)

HeadBuilder = Callable[[C, int, DataSchema, object], PolicyHead]
"""``build(config, hidden_size, schema, base)``: a freshly initialised head sized for
``schema`` and the backbone width; ``base`` is the resident base model (a family may start
from weights it holds). Raises ``SpecError`` when the base or schema does not fit."""


@dataclass(frozen=True)
class PolicyFamily(Generic[C]):
    """One policy family as the registry holds it: its config class and its builder."""

    config: type[C]
    build: HeadBuilder[C]

    @property
    def type(self) -> str:
        """The ``action_module.type`` naming the family (its config's default).

        Raises:
            ValueError: the config has no string default for ``type``.
        """
        kind = self.config.model_fields["type"].default
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"{self.config.__name__}: a policy config needs a default 'type'")
        return kind


def masked_mean(hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over the valid tokens of each row: ``[B, L, D]`` → ``[B, D]``.

    Padding never contributes, so the result does not depend on how much padding a
    grouped batch added to this row.
    """
    weights = attention_mask.to(hidden_states.dtype).unsqueeze(-1)
    total = (hidden_states * weights).sum(dim=1)
    count = weights.sum(dim=1).clamp_min(1.0)
    return total / count


def expand_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``mask`` broadcast to ``like``'s shape, in its dtype and device.

    Raises:
        SchemaMismatchError: when ``mask`` does not broadcast to ``like``.
    """
    try:
        return torch.broadcast_to(mask.to(device=like.device, dtype=like.dtype), like.shape)
    except RuntimeError as exc:
        raise SchemaMismatchError(
            f"action_mask: expected a shape broadcastable to {list(like.shape)}, "
            f"got {list(mask.shape)}",
            field="action_mask",
        ) from exc


def masked_reduce(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``values`` over entries where ``mask`` is set (all entries if ``None``).

    Raises:
        SchemaMismatchError: when ``mask`` does not broadcast to ``values``.
    """
    if mask is None:
        return values.mean()
    weights = expand_mask(mask, values)
    return (values * weights).sum() / weights.sum().clamp_min(1.0)


class ResidualMLPBlock(nn.Module):
    """Pre-norm residual MLP block: ``x + W2·GELU(W1·LN(x))``."""

    def __init__(self, width: int, expansion: int = 2, dropout: float = 0.0):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width * expansion)
        self.fc2 = nn.Linear(width * expansion, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return residual_mlp(module_layers(self), "", x)


def features_as(features: BackboneOutput, module: nn.Module) -> BackboneOutput:
    """The features on the module's device and dtype (a bf16 backbone may feed fp32 heads)."""
    param = next(module.parameters())
    hs = features.hidden_states
    if hs.device == param.device and hs.dtype == param.dtype:
        return features
    kv = features.prefix_kv
    return BackboneOutput(
        hidden_states=hs.to(device=param.device, dtype=param.dtype),
        attention_mask=features.attention_mask.to(param.device),
        layers=None
        if features.layers is None
        else {k: v.to(device=param.device, dtype=param.dtype) for k, v in features.layers.items()},
        prefix_kv=None
        if kv is None
        else tuple(
            (
                k.to(device=param.device, dtype=param.dtype),
                v.to(device=param.device, dtype=param.dtype),
            )
            for k, v in kv
        ),
        # The pixels stay where canonicalization left them (host memory): only a head
        # with an image encoder moves them, so other tenants pay no copy for them.
        images=features.images,
    )
