"""The JoyNexus Python client: :class:`Client` (sync) and :class:`AsyncClient`.

Both speak the HTTP API of ``joynexus serve``: the high-level workload calls and the
low-level primitives of paper Figure 4, with typed results, futures awaited with
progress callbacks, and retries with exponential backoff on 429 / 503.
"""

from __future__ import annotations

from joynexus.api import WorkloadMetrics, WorkloadState, WorkloadStatus
from joynexus.client._core import (
    APIError,
    FutureInfo,
    Prediction,
    RetryPolicy,
    ServerUnreachableError,
    StepInfo,
)
from joynexus.client.aio import AsyncClient
from joynexus.client.sync import Client

__all__ = [
    "APIError",
    "AsyncClient",
    "Client",
    "FutureInfo",
    "Prediction",
    "RetryPolicy",
    "ServerUnreachableError",
    "StepInfo",
    "WorkloadMetrics",
    "WorkloadState",
    "WorkloadStatus",
]
