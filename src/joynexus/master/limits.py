"""What the Master's tenant creator accepts on this server (its limits)."""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, Field

from joynexus.envs.limits import EnvLimits

__all__ = ["MasterLimits"]


class MasterLimits(EnvLimits):
    """What the tenant creator accepts on this server (errors quote these). The
    environment limits (``max_num_envs``, ``max_image_size``, ``denied_env_kinds``) are
    :class:`~joynexus.envs.limits.EnvLimits`', shared with HTTP environment sessions.

    Args:
        max_num_envs: Sub-envs of one workload's session.
        max_horizon: Rollout decisions per RL job.
        max_completion_target: Training jobs one workload may ask for.
        max_samples_per_job: SFT samples per job.
        max_microbatch_size: Samples per optimizer step.
        max_image_size: Side of environment camera images.
        max_eval_episodes: Episodes per evaluation run.
        max_active_workloads_per_tenant: Non-terminal workloads per tenant (at most one
            of them trainable: rl, sft or custom).
        dataset_roots: SFT datasets must live under one of these directories.
        denied_env_kinds: Environment kinds workloads may not use.
        cross_tenant_eval: An evaluation may target other tenants (a single-user
            ``joynexus run``); a shared server keeps every tenant to its own policy.
    """

    model_config = ConfigDict(extra="forbid")

    max_horizon: int = Field(default=1024, ge=1)
    max_completion_target: int = Field(default=100_000, ge=1)
    max_samples_per_job: int = Field(default=65_536, ge=1)
    max_microbatch_size: int = Field(default=4096, ge=1)
    max_eval_episodes: int = Field(default=1000, ge=1)
    max_active_workloads_per_tenant: int = Field(default=2, ge=1)
    dataset_roots: list[Path] = Field(default_factory=list)
    cross_tenant_eval: bool = False
