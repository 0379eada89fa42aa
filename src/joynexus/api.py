"""Plain data types the server, the Python client and the Master share (torch-free).

The client imports only this module of the service side (and :mod:`joynexus.wire`), so
it never pulls in the control plane, the model layer, the metrics layer or torch.

* Workloads: :class:`WorkloadState`, :class:`WorkloadStatus`, :class:`WorkloadMetrics`.
* Usage (``GET /v1/usage``): :class:`UsageReport` of :class:`TenantUsage`, keyed by the
  shared services in :data:`SERVICES`; :class:`~joynexus.metrics.usage.UsageMeter`
  produces them.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SERVICES",
    "ServiceName",
    "TenantUsage",
    "UsageReport",
    "WorkloadMetrics",
    "WorkloadState",
    "WorkloadStatus",
]


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
    restarts: int = Field(default=0, description="server restarts this workload resumed from")
    stalled: str | None = Field(
        default=None, description="set by the watchdog: why the workload looks stuck"
    )
    fault: str | None = Field(
        default=None,
        description="a service fault the workload is waiting out (e.g. its checkpoints "
        "cannot be written: disk full); cleared once it passed",
    )


class WorkloadMetrics(BaseModel):
    """A workload's metrics: JSONL records (optionally one kind) and a per-kind summary."""

    model_config = ConfigDict(extra="forbid")

    workload_id: str
    records: list[dict[str, Any]]
    summary: dict[str, dict[str, Any]]


# --- usage ------------------------------------------------------------------------------

ServiceName = Literal["training", "inference", "environment"]
#: The shared services whose device time is metered and attributed to tenants.
SERVICES: tuple[ServiceName, ...] = ("training", "inference", "environment")


def _zero_seconds() -> dict[str, float]:
    return dict.fromkeys(SERVICES, 0.0)


class TenantUsage(BaseModel):
    """One tenant's metered usage."""

    model_config = ConfigDict(extra="forbid")

    tenant_id: str
    device_seconds: dict[str, float] = Field(
        default_factory=_zero_seconds,
        description="service -> device-seconds attributed to this tenant",
    )
    requests: int = Field(0, description="predict requests accepted")
    inference_samples: int = Field(0, description="samples served in inference batches")
    samples_trained: int = Field(0, description="samples in optimizer steps")
    env_steps: int = Field(0, description="simulator steps (each sub-env counts)")

    @property
    def total_device_seconds(self) -> float:
        return sum(self.device_seconds.values())


class UsageReport(BaseModel):
    """A snapshot of the meter (what the API, CLI and dashboard show)."""

    model_config = ConfigDict(extra="forbid")

    started_at: float = Field(description="wall seconds when metering began")
    generated_at: float = Field(description="wall seconds of this snapshot")
    tenants: dict[str, TenantUsage]
    service_seconds: dict[str, float] = Field(
        description="service -> measured device-seconds (equals the sum over tenants)"
    )

    @classmethod
    def load(cls, path: str | Path) -> UsageReport:
        """Read a report the meter wrote (``usage.json``)."""
        return cls.model_validate_json(Path(path).read_text())
