"""Plain data types the server, the Python client and the Master share (torch-free).

The client imports only this module of the service side, so it never pulls in the
control plane, the model layer or torch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["WorkloadMetrics", "WorkloadState", "WorkloadStatus"]


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
