"""Config of the OFT family (``action_module.type: oft``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from joynexus.models.lora import LoRAConfig
from joynexus.models.policies.base import PolicyConfig
from joynexus.models.policies.image_encoder import ImageEncoderConfig


class OFTHeadConfig(PolicyConfig):
    """Hyperparameters of :class:`OFTHead` (small defaults suit tests and CPU runs)."""

    type: Literal["oft"] = "oft"
    hidden_dim: int = Field(default=128, gt=0, le=8192)
    num_blocks: int = Field(default=2, ge=0, le=32)
    pooling: Literal["mean", "attention", "positional", "flatten"] = Field(
        default="mean",
        description="'mean' = masked mean over valid tokens; 'attention' = one learned "
        "query; 'positional' = several learned queries over the tokens plus a learned "
        "embedding of each token's place, so where in the image a query looked survives "
        "pooling (the backbone's residual stream carries no absolute position); "
        "'flatten' = one linear read of the last `flatten_tokens` tokens concatenated "
        "(what a ridge probe of the frozen features does: nothing is averaged away).",
    )
    flatten_tokens: int | None = Field(
        default=None,
        gt=0,
        le=4096,
        description="How many tokens (counted from the last) 'flatten' pooling reads; "
        "fixed by the canonical image size and the prompt. Required with 'flatten'.",
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    init_log_std: float = Field(default=-1.0, ge=-10.0, le=2.0)
    min_log_std: float = Field(default=-5.0, ge=-20.0, le=0.0)
    max_log_std: float = Field(default=2.0, ge=-5.0, le=5.0)
    lora: LoRAConfig | None = Field(
        default=None,
        description="Optional tenant LoRA adapter on the shared backbone's language model.",
    )
    image_encoder: ImageEncoderConfig | None = Field(
        default=None,
        description="Optional trainable vision projection of the tenant's own: a small "
        "conv net over the canonical camera images whose spatial-softmax keypoints are "
        "added to the head's input (the shared backbone stays frozen and still runs). "
        "For learning from pixels when the frozen features do not carry where things are.",
    )

    @model_validator(mode="after")
    def _flatten_needs_a_token_count(self) -> OFTHeadConfig:
        if (self.pooling == "flatten") != (self.flatten_tokens is not None):
            raise ValueError("flatten_tokens is set with, and only with, pooling: flatten")
        return self
