"""The asynchronous Python client (httpx.AsyncClient): ``AsyncClient(url, api_key)``.

The same API as :class:`~joynexus.client.sync.Client` (whose docstring lists it), every
method a coroutine; the queue and scheduler primitives come from the same definitions
(:mod:`joynexus.client._primitives`) and return awaitables.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx
import numpy as np

from joynexus.api import UsageReport, WorkloadMetrics, WorkloadStatus
from joynexus.client import _ops as ops
from joynexus.client._core import (
    RETRY_STATUSES,
    APIError,
    Call,
    FutureInfo,
    Prediction,
    RetryPolicy,
    ServerUnreachableError,
    StepInfo,
    observations,
    train_batch_body,
)
from joynexus.client._primitives import Primitives

__all__ = ["AsyncClient"]

TERMINAL = ("completed", "failed", "cancelled")


class AsyncClient(Primitives[Awaitable[Any]]):
    """Asynchronous JoyNexus client.

    Args:
        url: Server base URL (default ``$JOYNEXUS_URL``).
        api_key: Tenant or admin key (default ``$JOYNEXUS_API_KEY``).
        timeout: Per-request timeout in seconds.
        retry: Backoff policy on 429 / 503.
        transport: An httpx transport (tests).
        sleep: How to wait between retries (tests record the delays).
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 120.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        base = url or os.environ.get("JOYNEXUS_URL") or "http://127.0.0.1:8000"
        key = api_key or os.environ.get("JOYNEXUS_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=base, headers=headers, timeout=timeout, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # --- execution ---------------------------------------------------------------------

    async def call(self, call: Call) -> Any:
        """Execute ``call`` with retries; its parsed result."""
        attempt = 0
        while True:
            response: httpx.Response | None = None
            try:
                response = await self._http.request(call.method, call.path, **call.request_kwargs())
            except httpx.TransportError as exc:
                if attempt >= self.retry.max_retries:
                    # One line for the caller (and every CLI command): no answer at URL.
                    raise ServerUnreachableError(str(self._http.base_url).rstrip("/"), exc) from exc
            else:
                if response.status_code not in RETRY_STATUSES or attempt >= self.retry.max_retries:
                    return call.result(response)
            await self._sleep(self.retry.delay(attempt, response))
            attempt += 1

    def _run(self, call: Call) -> Awaitable[Any]:
        return self.call(call)

    async def wait_future(
        self,
        future: FutureInfo | str,
        *,
        timeout_s: float = 3600.0,
        on_progress: Callable[[FutureInfo], None] | None = None,
    ) -> dict[str, Any]:
        """Long-poll a future until it finishes; its result.

        Raises:
            APIError: the operation failed (its error body) or was cancelled.
            TimeoutError: still pending after ``timeout_s``.
        """
        fid = future if isinstance(future, str) else future.future_id
        deadline = time.monotonic() + timeout_s
        while True:
            info: FutureInfo = await self.call(ops.future(fid, wait_s=5.0))
            if on_progress is not None:
                on_progress(info)
            if info.state == "succeeded":
                return info.result or {}
            if info.state in ("failed", "cancelled"):
                err = info.error or {"code": info.state, "message": f"future {fid} {info.state}"}
                raise APIError(
                    int(err.get("status", 500)), err["code"], err["message"], err.get("details")
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"future {fid} still pending after {timeout_s} s")

    # --- tenants -----------------------------------------------------------------------

    async def create_tenant(self, tenant_id: str, quotas: Mapping[str, Any] | None = None) -> Any:
        """Create a tenant (admin key); the answer holds its first ``api_key``."""
        return await self.call(ops.create_tenant(tenant_id, quotas))

    async def list_tenants(self) -> Any:
        return await self.call(ops.list_tenants())

    async def me(self) -> Any:
        return await self.call(ops.me())

    async def usage(self, tenant_id: str | None = None) -> UsageReport:
        """Metered usage: a tenant key gets its own, an admin key every tenant's (or
        ``tenant_id``'s)."""
        result: UsageReport = await self.call(ops.usage(tenant_id))
        return result

    async def dashboard_state(self, tenant_id: str | None = None) -> dict[str, Any]:
        """What the dashboard draws (tenants, workloads, queues, curves, ...)."""
        result: dict[str, Any] = await self.call(ops.dashboard_state(tenant_id))
        return result

    # --- workloads -----------------------------------------------------------------------

    async def submit(self, spec: Any) -> WorkloadStatus:
        """Submit a workload (mapping, ``WorkloadSpec`` or YAML path)."""
        result: WorkloadStatus = await self.call(ops.submit(spec))
        return result

    async def list_workloads(self) -> list[WorkloadStatus]:
        result: list[WorkloadStatus] = await self.call(ops.list_workloads())
        return result

    async def workload(self, workload_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(ops.workload(workload_id))
        return result

    async def status(self, workload_id: str) -> WorkloadStatus:
        result: WorkloadStatus = await self.call(ops.status(workload_id))
        return result

    async def pause(self, workload_id: str) -> WorkloadStatus:
        result: WorkloadStatus = await self.call(ops.lifecycle(workload_id, "pause"))
        return result

    async def resume(self, workload_id: str) -> WorkloadStatus:
        result: WorkloadStatus = await self.call(ops.lifecycle(workload_id, "resume"))
        return result

    async def cancel(self, workload_id: str) -> WorkloadStatus:
        result: WorkloadStatus = await self.call(ops.lifecycle(workload_id, "cancel"))
        return result

    async def wait(
        self,
        workload_id: str,
        *,
        states: Sequence[str] = TERMINAL,
        poll_s: float = 0.5,
        timeout_s: float = 3600.0,
        on_progress: Callable[[WorkloadStatus], None] | None = None,
    ) -> WorkloadStatus:
        """Poll the workload's status until it reaches one of ``states``.

        Raises:
            TimeoutError: not there after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            st = await self.status(workload_id)
            if on_progress is not None:
                on_progress(st)
            if st.state.value in states or (st.state.value in TERMINAL):
                return st
            if time.monotonic() > deadline:
                raise TimeoutError(f"workload {workload_id} is still {st.state.value}")
            await asyncio.sleep(poll_s)

    async def metrics(
        self, workload_id: str, kind: str | None = None, limit: int | None = None
    ) -> WorkloadMetrics:
        result: WorkloadMetrics = await self.call(ops.metrics(workload_id, kind, limit))
        return result

    async def artifacts(self, workload_id: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self.call(ops.artifacts(workload_id))
        return result

    async def download(self, workload_id: str, path: str) -> bytes:
        result: bytes = await self.call(ops.download(workload_id, path))
        return result

    async def export(self, tenant_id: str) -> bytes:
        """The tenant's action module (msgpack: ``manifest`` + ``named_tensors``)."""
        result: bytes = await self.call(ops.export(tenant_id))
        return result

    # --- environment sessions ------------------------------------------------------------

    async def create_session(
        self, spec: Mapping[str, Any], *, timeout_s: float = 600.0
    ) -> dict[str, Any]:
        """Start a simulator session and wait for it; the session (id, schema, ...)."""
        return await self.wait_future(
            await self.call(ops.create_session(spec)), timeout_s=timeout_s
        )

    async def reset(
        self, session_id: str, rollout_id: str, seed: int | None = None
    ) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(ops.reset(session_id, rollout_id, seed))
        return result

    async def step(self, session_id: str, actions: np.ndarray) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(ops.step(session_id, actions))
        return result

    async def close_session(self, session_id: str) -> None:
        await self.call(ops.close_session(session_id))

    async def list_sessions(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self.call(ops.list_sessions())
        return result

    # --- model primitives ------------------------------------------------------------------

    async def predict(
        self,
        tenant_id: str,
        cameras: Mapping[str, np.ndarray],
        state: np.ndarray,
        instructions: list[str],
        *,
        policy_version: int | None = None,
        mode: str = "mean",
    ) -> Prediction:
        obs = observations(cameras, state, instructions)
        result: Prediction = await self.call(ops.predict(tenant_id, obs, policy_version, mode))
        return result

    async def train_batch(
        self,
        tenant_id: str,
        cameras: Mapping[str, np.ndarray],
        state: np.ndarray,
        instructions: list[str],
        actions: np.ndarray,
        *,
        loss: str = "sft",
        advantages: np.ndarray | None = None,
        old_log_probs: np.ndarray | None = None,
        returns: np.ndarray | None = None,
        flow_chain: np.ndarray | None = None,
    ) -> StepInfo:
        body = train_batch_body(
            cameras,
            state,
            instructions,
            actions,
            loss=loss,
            tensors={
                "advantages": advantages,
                "old_log_probs": old_log_probs,
                "returns": returns,
                "flow_chain": flow_chain,
            },
        )
        result: StepInfo = await self.call(ops.train_batch(tenant_id, body))
        return result

    async def export_params(self, tenant_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(ops.export_params(tenant_id))
        return result

    async def load_weights(
        self, tenant_id: str, version: int, named_tensors: Mapping[str, np.ndarray]
    ) -> int:
        result: int = await self.call(ops.load_weights(tenant_id, version, named_tensors))
        return result

    async def save(self, tenant_id: str, include_optim: bool = True) -> list[str]:
        out = await self.wait_future(await self.call(ops.save(tenant_id, include_optim)))
        return list(out.get("paths", []))

    async def rollout(self, tenant_id: str, **body: Any) -> dict[str, Any]:
        """``rollout(job_id=, session_id=, num_envs=, horizon=, version=, seed=)``."""
        return await self.wait_future(await self.call(ops.rollout(tenant_id, body)))

    async def train_job(self, tenant_id: str, job_id: str) -> dict[str, Any]:
        return await self.wait_future(await self.call(ops.train_job(tenant_id, job_id)))
