"""OFT-style action head: an MLP-ResNet from pooled backbone features (+ state) to a chunk.

Following the OpenVLA-OFT recipe, the whole chunk is regressed in one shot with an L1
loss. For RL the same network is the mean of a diagonal Gaussian policy whose
state-independent log-std is a learned parameter, so PPO can compute log-probs and
entropy without a second network.

The robot state enters through its own projection (OFT's proprio projector), added to
the projection of the pooled backbone features, rather than as a few extra columns of
one concatenated input. Measured on reach2d with a tiny backbone: mean-pooled features
vary only ~5 % between observations, and concatenated with 128 LayerNorm-ed feature
dims the 4 state dims moved the hidden pre-activations by ~9 % of their size, so the
policy mean was almost constant across states and PPO could only shift it as a
whole (towards a wall). With a separate projection the state's share is ~45 % and
PPO learns "move along goal - agent". The output layer
starts at 1 % of its default scale (standard PPO practice), so the initial policy mean
is ~0 and the first updates are not dominated by a random offset.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence

import torch
from torch import nn

from joynexus.errors import InvalidRequestError
from joynexus.models.policies.base import (
    PolicyGaussians,
    PolicyHead,
    PolicySample,
    ResidualMLPBlock,
    expand_mask,
    features_as,
    masked_mean,
    masked_reduce,
)
from joynexus.models.policies.image_encoder import SpatialSoftmaxEncoder
from joynexus.models.policies.layers import (
    LayerReader,
    StackedLayers,
    module_layers,
    residual_mlp,
)
from joynexus.models.policies.oft.config import OFTHeadConfig
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput

_LOG_2PI = math.log(2.0 * math.pi)
OUTPUT_INIT_SCALE = 0.01
"""Scale of the output layer's initial weights (bias 0): the initial mean is ~0."""


class AttentionPooling(nn.Module):
    """One learned query attending over the valid backbone tokens."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(hidden_size))
        self.key = nn.Linear(hidden_size, hidden_size, bias=False)
        self.scale = hidden_size**-0.5

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        scores = (self.key(hidden_states) @ self.query) * self.scale  # [B, L]
        scores = scores.masked_fill(attention_mask == 0, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1).unsqueeze(-1)
        return (weights * hidden_states).sum(dim=1)


class PositionalPooling(nn.Module):
    """Several learned queries over the valid tokens, each token tagged with a learned
    embedding of its place counted from the last token.

    Why: a backbone with rotary positions keeps no absolute position in its hidden
    states, so a query that finds "the green patch" among the image tokens returns what
    it looks like, not where it is — and where is the goal. Inputs are left-padded, so a
    token's distance from the end is the same for every row of one schema: the
    embedding names the image token (and so the place in the frame) it came from.
    """

    QUERIES = 4
    MAX_TOKENS = 4096

    def __init__(self, hidden_size: int):
        super().__init__()
        self.queries = nn.Parameter(torch.randn(self.QUERIES, hidden_size) * hidden_size**-0.5)
        self.key = nn.Linear(hidden_size, hidden_size, bias=False)
        self.position = nn.Embedding(self.MAX_TOKENS, hidden_size)
        nn.init.normal_(self.position.weight, std=0.02)
        self.out = nn.Linear(self.QUERIES * hidden_size, hidden_size)
        self.scale = hidden_size**-0.5

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        length = hidden_states.shape[1]
        if length > self.MAX_TOKENS:
            raise InvalidRequestError(
                f"positional pooling reads at most {self.MAX_TOKENS} tokens, got {length}",
                field="action_module.pooling",
            )
        from_end = torch.arange(length - 1, -1, -1, device=hidden_states.device)
        tokens = hidden_states + self.position(from_end).to(hidden_states)  # [B, L, D]
        scores = torch.einsum("bld,qd->bql", self.key(tokens), self.queries) * self.scale
        invalid = (attention_mask == 0).unsqueeze(1)
        scores = scores.masked_fill(invalid, torch.finfo(scores.dtype).min)
        pooled = torch.softmax(scores, dim=-1) @ tokens  # [B, Q, D]
        out: torch.Tensor = self.out(pooled.flatten(1))
        return out


class FlattenPooling(nn.Module):
    """A linear read of the last ``tokens`` tokens concatenated, each LayerNorm-ed.

    Why: a ridge probe on the frozen backbone's tokens, all concatenated, recovers the
    goal's place (docs/RESULTS.md §15.1) while every pooling over the token set lost it.
    Reading each token through its own weights keeps which token (and so which place in
    the frame) said what. Inputs are left-padded and every observation of one canonical
    size and prompt has the same token count, so token k is the same place in every row.
    Dropout on the concatenated input keeps a few thousand frames from being memorized.
    """

    def __init__(self, hidden_size: int, tokens: int, dropout: float):
        super().__init__()
        self.tokens = tokens
        self.norm = nn.LayerNorm(hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.read = nn.Linear(tokens * hidden_size, hidden_size)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        counts = attention_mask.sum(dim=1)
        if bool((counts != self.tokens).any()):
            # Another count means another canonical size or prompt: the weights of
            # token k would read a different place in the frame, silently.
            raise InvalidRequestError(
                f"flatten pooling reads exactly {self.tokens} tokens per observation, got "
                f"{sorted(set(counts.tolist()))}: set action_module.flatten_tokens to the "
                "backbone's token count for this canonical image size and prompt",
                field="action_module.flatten_tokens",
            )
        window = self.norm(hidden_states[:, -self.tokens :])
        out: torch.Tensor = self.read(self.dropout(window.flatten(1)))
        return out


class OFTHead(PolicyHead):
    """MLP-ResNet action head with a Gaussian policy on top of its mean.

    Args:
        config: Head hyperparameters.
        hidden_size: Backbone feature width ``D``.
        state_dim, action_dim, action_chunk: The tenant schema's dims.
        num_cameras: The tenant schema's cameras (read by ``config.image_encoder``).
    """

    def __init__(
        self,
        config: OFTHeadConfig,
        *,
        hidden_size: int,
        state_dim: int,
        action_dim: int,
        action_chunk: int,
        num_cameras: int = 1,
    ):
        super().__init__(
            hidden_size=hidden_size,
            state_dim=state_dim,
            action_dim=action_dim,
            action_chunk=action_chunk,
        )
        self.config = config
        self.pool: AttentionPooling | PositionalPooling | FlattenPooling | None = None
        if config.pooling == "attention":
            self.pool = AttentionPooling(hidden_size)
        elif config.pooling == "positional":
            self.pool = PositionalPooling(hidden_size)
        elif config.pooling == "flatten":
            assert config.flatten_tokens is not None  # the config's validator ensures it
            self.pool = FlattenPooling(hidden_size, config.flatten_tokens, config.dropout)
        self.input_norm = nn.LayerNorm(hidden_size)
        self.input_proj = nn.Linear(hidden_size, config.hidden_dim)
        self.state_proj: nn.Linear | None = (
            nn.Linear(state_dim, config.hidden_dim) if state_dim > 0 else None
        )
        # Like the state, the tenant's own image read-out enters by a projection of its
        # own added to the pooled features' (see the module doc).
        self.image_encoder: SpatialSoftmaxEncoder | None = (
            None
            if config.image_encoder is None
            else SpatialSoftmaxEncoder(config.image_encoder, num_cameras, config.hidden_dim)
        )
        self.blocks = nn.Sequential(
            *(
                ResidualMLPBlock(config.hidden_dim, dropout=config.dropout)
                for _ in range(config.num_blocks)
            )
        )
        self.out_norm = nn.LayerNorm(config.hidden_dim)
        self.out_proj = nn.Linear(config.hidden_dim, action_chunk * action_dim)
        with torch.no_grad():
            self.out_proj.weight.mul_(OUTPUT_INIT_SCALE)
            self.out_proj.bias.zero_()
        self.log_std = nn.Parameter(torch.full((action_dim,), config.init_log_std))

    def mean(self, features: BackboneOutput, state: torch.Tensor) -> torch.Tensor:
        """The regressed action chunk ``[B, chunk, action_dim]`` (the policy mean)."""
        self.check_inputs(features, state)
        features = features_as(features, self)
        hs, mask = features.hidden_states, features.attention_mask
        pooled = masked_mean(hs, mask) if self.pool is None else self.pool(hs, mask)
        images = None if self.image_encoder is None else self.image_encoder(features.images)
        return self._chunk(module_layers(self), pooled, state, images)

    def _chunk(
        self,
        layers: LayerReader,
        pooled: torch.Tensor,
        state: torch.Tensor,
        images: torch.Tensor | None,
    ) -> torch.Tensor:
        """Pooled features (+ state, + the image read-out) → ``[R, chunk, A]``, through
        ``layers`` (this head's own, or a group's stacked per row)."""
        x = layers.linear("input_proj", layers.layer_norm("input_norm", pooled))
        if self.state_proj is not None:
            x = x + layers.linear("state_proj", state.to(pooled))
        if images is not None:
            x = x + images
        for i in range(len(self.blocks)):
            x = residual_mlp(layers, f"blocks.{i}.", x)
        out = layers.linear("out_proj", layers.layer_norm("out_norm", x))
        return out.view(-1, self.action_chunk, self.action_dim)

    def group_key(self) -> Hashable | None:
        """OFT heads with mean pooling and no image encoder of their own group by their
        layer shapes (the pooling and encoder modules would each be another per-tenant
        pass)."""
        if self.pool is not None or self.image_encoder is not None:
            return None
        weight = self.out_proj.weight
        return (
            "oft",
            self.hidden_size,
            self.state_dim,
            self.action_dim,
            self.action_chunk,
            self.config.hidden_dim,
            len(self.blocks),
            weight.dtype,
            weight.device,
        )

    @classmethod
    @torch.no_grad()
    def predict_group(
        cls,
        heads: Sequence[PolicyHead],
        features: BackboneOutput,
        state: torch.Tensor,
        owner: Sequence[int],
    ) -> torch.Tensor:
        """The policy means of several tenants' heads (see :meth:`group_key`) at once."""
        lead = heads[0]
        assert isinstance(lead, OFTHead) and lead.group_key() is not None
        lead.check_inputs(features, state)
        features = features_as(features, lead)
        pooled = masked_mean(features.hidden_states, features.attention_mask)
        return lead._chunk(StackedLayers(heads, owner), pooled, state, None)

    def loss(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """L1 between the regressed chunk and ``actions`` over valid entries."""
        self.check_inputs(features, state, actions)
        pred = self.mean(features, state)
        return masked_reduce((pred - actions.to(pred)).abs(), action_mask)

    @torch.no_grad()
    def predict(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Deterministic action: the policy mean."""
        return self.mean(features, state)

    # --- Gaussian policy (RL) -------------------------------------------------------

    def clamped_log_std(self) -> torch.Tensor:
        """The per-action-dim log-std, clamped to the configured range."""
        return self.log_std.clamp(self.config.min_log_std, self.config.max_log_std)

    def log_prob(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        action_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Log-density ``[B]`` of each whole chunk under the diagonal Gaussian policy.

        Masked-out entries contribute nothing, so padded action dims and steps past the
        end of an episode do not bias PPO ratios.
        """
        self.check_inputs(features, state, actions)
        mu = self.mean(features, state)
        log_std = self.clamped_log_std()
        z = (actions.to(mu) - mu) * torch.exp(-log_std)
        per_entry = -0.5 * z.pow(2) - log_std - 0.5 * _LOG_2PI
        if action_mask is not None:
            per_entry = per_entry * expand_mask(action_mask, per_entry)
        return per_entry.flatten(1).sum(dim=-1)

    def entropy(self) -> torch.Tensor:
        """Entropy of the policy for one chunk (scalar; state-independent log-std)."""
        per_dim = self.clamped_log_std() + 0.5 * (1.0 + _LOG_2PI)
        return per_dim.sum() * self.action_chunk

    def sample(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> PolicySample:
        """Draw a chunk from the policy: ``(actions [B, chunk, A], log_prob [B], None)``."""
        mu = self.mean(features, state)
        noise = torch.randn(mu.shape, generator=generator, device=mu.device, dtype=mu.dtype)
        return _gaussian_draw(mu, self.clamped_log_std(), noise)

    @classmethod
    @torch.no_grad()
    def sample_group(
        cls,
        heads: Sequence[PolicyHead],
        features: BackboneOutput,
        state: torch.Tensor,
        owner: Sequence[int],
        generators: Sequence[torch.Generator | None],
    ) -> PolicySample:
        """:meth:`sample` of several tenants' heads at once: the means in one stacked
        pass, each head's noise drawn from its own generator for its own rows (so each
        tenant's draws are the ones it would make alone)."""
        # Each head's rows contiguous, in head order: its noise is one draw, as alone.
        assert all(a <= b for a, b in itertools.pairwise(owner)), "rows out of head order"
        mu = cls.predict_group(heads, features, state, owner)
        own: list[torch.Tensor] = []
        for head in heads:
            assert isinstance(head, OFTHead)  # one group key: one family
            own.append(head.clamped_log_std())
        counts = [0] * len(heads)
        for k in owner:
            counts[k] += 1
        shape = mu.shape[1:]
        noise = torch.cat(
            [
                torch.randn((n, *shape), generator=gen, device=mu.device, dtype=mu.dtype)
                for n, gen in zip(counts, generators, strict=True)
            ]
        )
        log_std = torch.stack([own[k] for k in owner]).unsqueeze(1)  # [R, 1, A]
        return _gaussian_draw(mu, log_std, noise)

    def rl_log_prob(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        fields: Mapping[str, torch.Tensor],
    ) -> torch.Tensor:
        """The Gaussian log-density of the behaviour actions (no recorded fields needed)."""
        return self.log_prob(features, state, actions)

    def rl_gaussians(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        fields: Mapping[str, torch.Tensor],
    ) -> PolicyGaussians:
        """One diagonal Gaussian over the chunk: the mean and the clamped std."""
        self.check_inputs(features, state, actions)
        mu = self.mean(features, state)
        return PolicyGaussians(actions.to(mu), mu, self.clamped_log_std().exp(), None)


def _gaussian_draw(mu: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor) -> PolicySample:
    """Actions ``mu + noise·σ`` and the log-density of each chunk (``log_std`` broadcast
    to ``mu``: one head's ``[A]`` or a group's ``[R, 1, A]``)."""
    actions = mu + noise * torch.exp(log_std)
    per_entry = -0.5 * noise.pow(2) - log_std - 0.5 * _LOG_2PI
    return PolicySample(actions, per_entry.flatten(1).sum(dim=-1))


def build_oft_head(
    config: OFTHeadConfig, hidden_size: int, schema: DataSchema, base: object
) -> PolicyHead:
    """A fresh :class:`OFTHead` for ``schema`` on a backbone of width ``hidden_size``."""
    return OFTHead(
        config,
        hidden_size=hidden_size,
        state_dim=schema.state_dim,
        action_dim=schema.action_dim,
        action_chunk=schema.action_chunk,
        num_cameras=len(schema.cameras),
    )
