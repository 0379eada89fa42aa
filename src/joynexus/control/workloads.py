"""Workload records of the Master Service: lifecycle states, limits and status rows.

Plain data shared by the Master (:mod:`joynexus.control.master`), the HTTP routes and
the Python client, so the three agree on one shape.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MasterLimits", "WorkloadMetrics", "WorkloadState", "WorkloadStatus"]


class WorkloadState(StrEnum):
    """Lifecycle of one workload.

    ``starting`` (slot, session, dataset being prepared) → ``running`` ⇄ ``paused`` →
    ``completed`` | ``failed`` | ``cancelled``. A custom workload stays ``running``
    until it is cancelled: the tenant drives it.
    """

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (WorkloadState.COMPLETED, WorkloadState.FAILED, WorkloadState.CANCELLED)


class MasterLimits(BaseModel):
    """What the tenant creator accepts on this server (errors quote these).

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
    """

    model_config = ConfigDict(extra="forbid")

    max_num_envs: int = Field(default=16, ge=1)
    max_horizon: int = Field(default=1024, ge=1)
    max_completion_target: int = Field(default=100_000, ge=1)
    max_samples_per_job: int = Field(default=65_536, ge=1)
    max_microbatch_size: int = Field(default=4096, ge=1)
    max_image_size: int = Field(default=512, ge=1)
    max_eval_episodes: int = Field(default=1000, ge=1)
    max_active_workloads_per_tenant: int = Field(default=2, ge=1)
    dataset_roots: list[Path] = Field(default_factory=list)
    denied_env_kinds: list[str] = Field(default_factory=lambda: ["remote"])


class WorkloadStatus(BaseModel):
    """One workload as its tenant sees it (no server paths)."""

    model_config = ConfigDict(extra="forbid")

    workload_id: str
    tenant_id: str
    task: str
    state: WorkloadState
    created_at: float
    finished_at: float | None = None
    schema_signature: str | None = None
    jobs_completed: int = 0
    jobs_target: int | None = None
    jobs_in_flight: int = 0
    jobs_failed: int = 0
    jobs_dropped: int = 0
    eval_runs_completed: int = 0
    eval_runs_target: int | None = None
    policy_version: int | None = None
    session_id: str | None = None
    error: str | None = None


class WorkloadMetrics(BaseModel):
    """A workload's metrics: JSONL records (optionally one kind) and a per-kind summary."""

    model_config = ConfigDict(extra="forbid")

    workload_id: str
    records: list[dict[str, Any]]
    summary: dict[str, dict[str, Any]]
