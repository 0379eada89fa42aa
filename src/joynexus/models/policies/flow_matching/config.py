"""Config of the flow-matching DiT family (``action_module.type: flow_matching``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from joynexus.models.lora import LoRAConfig
from joynexus.models.policies.base import PolicyConfig
from joynexus.models.policies.flow import check_flow_rl


class FlowMatchingHeadConfig(PolicyConfig):
    """Hyperparameters of :class:`FlowMatchingHead` (small defaults)."""

    type: Literal["flow_matching"] = "flow_matching"
    hidden_dim: int = Field(default=64, gt=0, le=4096)
    num_layers: int = Field(default=2, ge=1, le=32)
    num_heads: int = Field(default=4, ge=1, le=64)
    mlp_ratio: int = Field(default=2, ge=1, le=8)
    num_inference_steps: int = Field(default=10, ge=1, le=1000)
    time_sampling: Literal["uniform", "beta"] = "beta"
    timestep_scale: float = Field(
        default=1000.0, gt=0, description="t is multiplied by this before the sinusoid."
    )
    sde_noise_level: float = Field(
        default=0.5,
        gt=0,
        le=4.0,
        description="Flow-SDE noise level η of RL sampling (mode 'sample'): step k adds "
        "Gaussian noise of std η·sqrt((1 − t_k)/steps); see models.policies.flow.",
    )
    lora: LoRAConfig | None = Field(
        default=None,
        description="Optional tenant LoRA adapter on the shared backbone's language model.",
    )

    @model_validator(mode="after")
    def _heads_divide_width(self) -> FlowMatchingHeadConfig:
        if self.hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim ({self.hidden_dim}) must be divisible by num_heads ({self.num_heads})"
            )
        return self

    def check_rl(self, *, entropy_coef: float) -> None:
        check_flow_rl(self.type, self.num_inference_steps, entropy_coef=entropy_coef)
