"""Value head for RL: pooled backbone features (+ state) → one scalar per sample."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from joynexus.errors import SchemaMismatchError
from joynexus.models.policies.base import ResidualMLPBlock, features_as, masked_mean
from joynexus.models.policies.image_encoder import ImageEncoderConfig, SpatialSoftmaxEncoder
from joynexus.models.types import BackboneOutput


class ValueHeadConfig(BaseModel):
    """Hyperparameters of :class:`ValueHead`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["value"] = "value"
    hidden_dim: int = Field(default=128, gt=0, le=8192)
    num_blocks: int = Field(default=1, ge=0, le=32)
    image_encoder: ImageEncoderConfig | None = Field(
        default=None,
        description="The critic's own image encoder; a tenant whose action module has "
        "one gets one here too, so the critic sees what the actor sees.",
    )


class ValueHead(nn.Module):
    """Critic ``V(o)``: masked-mean pooled features and state through a small MLP-ResNet.

    Like :class:`~joynexus.models.policies.oft.OFTHead`, the state has its own projection
    added to the features' (a concatenated state is drowned by the pooled features, and
    the critic then cannot tell near from far states); the output starts at ~0.

    Args:
        config: Head hyperparameters.
        hidden_size: Backbone feature width ``D``.
        state_dim: The tenant's state width (0 = none).
        num_cameras: The tenant's cameras (read by ``config.image_encoder``).
    """

    def __init__(
        self,
        config: ValueHeadConfig,
        *,
        hidden_size: int,
        state_dim: int,
        num_cameras: int = 1,
    ):
        super().__init__()
        self.config = config
        self.hidden_size = hidden_size
        self.state_dim = state_dim
        self.input_norm = nn.LayerNorm(hidden_size)
        self.input_proj = nn.Linear(hidden_size, config.hidden_dim)
        self.state_proj: nn.Linear | None = (
            nn.Linear(state_dim, config.hidden_dim) if state_dim > 0 else None
        )
        self.image_encoder: SpatialSoftmaxEncoder | None = (
            None
            if config.image_encoder is None
            else SpatialSoftmaxEncoder(config.image_encoder, num_cameras, config.hidden_dim)
        )
        self.blocks = nn.Sequential(
            *(ResidualMLPBlock(config.hidden_dim) for _ in range(config.num_blocks))
        )
        self.out_norm = nn.LayerNorm(config.hidden_dim)
        self.out = nn.Linear(config.hidden_dim, 1)
        with torch.no_grad():
            self.out.weight.mul_(0.01)
            self.out.bias.zero_()

    def forward(self, features: BackboneOutput, state: torch.Tensor) -> torch.Tensor:
        """Values ``[B]``."""
        hs = features.hidden_states
        if hs.shape[-1] != self.hidden_size or tuple(state.shape) != (
            hs.shape[0],
            self.state_dim,
        ):
            raise SchemaMismatchError(
                f"value head expects hidden_states [B, L, {self.hidden_size}] and state "
                f"[B, {self.state_dim}], got {list(hs.shape)} and {list(state.shape)}",
                field="state",
            )
        features = features_as(features, self)
        pooled = masked_mean(features.hidden_states, features.attention_mask)
        x = self.input_proj(self.input_norm(pooled))
        if self.state_proj is not None:
            x = x + self.state_proj(state.to(pooled))
        if self.image_encoder is not None:
            x = x + self.image_encoder(features.images)
        value: torch.Tensor = self.out(self.out_norm(self.blocks(x)))
        return value.squeeze(-1)

    def loss(
        self, features: BackboneOutput, state: torch.Tensor, returns: torch.Tensor
    ) -> torch.Tensor:
        """Mean squared error against the return targets ``[B]``."""
        values: torch.Tensor = self(features, state)
        return (values - returns.to(values)).pow(2).mean()
