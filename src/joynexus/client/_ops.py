"""Every API operation as a :class:`~joynexus.client._core.Call` (one place for paths)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from joynexus.api import UsageReport, WorkloadMetrics, WorkloadStatus
from joynexus.client._core import Call, FutureInfo, StepInfo, prediction


def spec_body(spec: Any) -> dict[str, Any]:
    """A workload spec as JSON data: a mapping, a pydantic spec, or a YAML file path."""
    if isinstance(spec, str | Path):
        data = yaml.safe_load(Path(spec).read_text())
        if isinstance(data, dict) and "workloads" in data:
            data = data["workloads"]
        if isinstance(data, list):
            if len(data) != 1:
                raise ValueError(f"{spec}: submit one workload per call, found {len(data)}")
            data = data[0]
        if not isinstance(data, dict):
            raise ValueError(f"{spec}: expected a mapping at the top level")
        return data
    if hasattr(spec, "model_dump"):
        out: dict[str, Any] = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        return out
    return dict(spec)


def _list_of(model: Any) -> Any:
    return lambda body: [model.model_validate(x) for x in body]


# --- tenants (admin) ---------------------------------------------------------------


def create_tenant(tenant_id: str, quotas: Mapping[str, Any] | None = None) -> Call:
    body: dict[str, Any] = {"tenant_id": tenant_id}
    if quotas is not None:
        body["quotas"] = dict(quotas)
    return Call("POST", "/v1/tenants", json=body)


def list_tenants() -> Call:
    return Call("GET", "/v1/tenants")


def me() -> Call:
    return Call("GET", "/v1/me")


# --- usage and dashboard -----------------------------------------------------------


def usage(tenant_id: str | None = None) -> Call:
    params = {} if tenant_id is None else {"tenant_id": tenant_id}
    return Call("GET", "/v1/usage", params=params, parse=UsageReport.model_validate)


def dashboard_state(tenant_id: str | None = None) -> Call:
    params = {} if tenant_id is None else {"tenant_id": tenant_id}
    return Call("GET", "/v1/dashboard/state", params=params)


# --- workloads ---------------------------------------------------------------------


def submit(spec: Any) -> Call:
    return Call("POST", "/v1/workloads", json=spec_body(spec), parse=WorkloadStatus.model_validate)


def list_workloads() -> Call:
    return Call("GET", "/v1/workloads", parse=_list_of(WorkloadStatus))


def workload(workload_id: str) -> Call:
    return Call("GET", f"/v1/workloads/{workload_id}")


def status(workload_id: str) -> Call:
    return Call("GET", f"/v1/workloads/{workload_id}/status", parse=WorkloadStatus.model_validate)


def lifecycle(workload_id: str, action: str) -> Call:
    return Call(
        "POST", f"/v1/workloads/{workload_id}/{action}", parse=WorkloadStatus.model_validate
    )


def metrics(workload_id: str, kind: str | None = None, limit: int | None = None) -> Call:
    params: dict[str, Any] = {}
    if kind is not None:
        params["kind"] = kind
    if limit is not None:
        params["limit"] = limit
    return Call(
        "GET",
        f"/v1/workloads/{workload_id}/metrics",
        params=params,
        parse=WorkloadMetrics.model_validate,
    )


def artifacts(workload_id: str) -> Call:
    return Call("GET", f"/v1/workloads/{workload_id}/artifacts")


def download(workload_id: str, path: str) -> Call:
    return Call("GET", f"/v1/workloads/{workload_id}/artifacts/{path}", raw=True)


# --- futures -------------------------------------------------------------------------


def future(future_id: str, wait_s: float = 0.0) -> Call:
    return Call(
        "GET",
        f"/v1/futures/{future_id}",
        params={"wait": wait_s} if wait_s > 0 else {},
        parse=FutureInfo.model_validate,
    )


# --- environment sessions ----------------------------------------------------------


def create_session(spec: Mapping[str, Any]) -> Call:
    return Call(
        "POST", "/v1/env/sessions", json={"spec": dict(spec)}, parse=FutureInfo.model_validate
    )


def reset(session_id: str, rollout_id: str, seed: int | None = None) -> Call:
    body: dict[str, Any] = {"rollout_id": rollout_id}
    if seed is not None:
        body["seed"] = seed
    return Call("POST", f"/v1/env/sessions/{session_id}/reset", json=body, accept_msgpack=True)


def step(session_id: str, actions: np.ndarray) -> Call:
    return Call(
        "POST",
        f"/v1/env/sessions/{session_id}/step",
        msgpack={"actions": np.ascontiguousarray(actions, dtype=np.float32)},
        accept_msgpack=True,
    )


def close_session(session_id: str) -> Call:
    return Call("DELETE", f"/v1/env/sessions/{session_id}")


def list_sessions() -> Call:
    return Call("GET", "/v1/env/sessions")


# --- model primitives ----------------------------------------------------------------


def _model(tenant: str, op: str) -> str:
    return f"/v1/models/{tenant}/{op}"


def predict(tenant: str, obs: Mapping[str, Any], policy_version: int | None, mode: str) -> Call:
    body: dict[str, Any] = {"observations": dict(obs), "mode": mode}
    if policy_version is not None:
        body["policy_version"] = policy_version
    return Call(
        "POST", _model(tenant, "predict"), msgpack=body, accept_msgpack=True, parse=prediction
    )


def train_batch(tenant: str, body: Mapping[str, Any]) -> Call:
    return Call(
        "POST", _model(tenant, "train_batch"), msgpack=dict(body), parse=StepInfo.model_validate
    )


def export_params(tenant: str) -> Call:
    return Call("POST", _model(tenant, "export_params"), accept_msgpack=True)


def load_weights(tenant: str, version: int, named: Mapping[str, np.ndarray]) -> Call:
    body = {"version": version, "named_tensors": dict(named)}
    return Call(
        "POST",
        _model(tenant, "load_weights"),
        msgpack=body,
        parse=lambda b: int(b["policy_version"]),
    )


def save(tenant: str, include_optim: bool = True) -> Call:
    return Call(
        "POST",
        _model(tenant, "save"),
        json={"include_optim": include_optim},
        parse=FutureInfo.model_validate,
    )


def rollout(tenant: str, body: Mapping[str, Any]) -> Call:
    return Call("POST", _model(tenant, "rollout"), json=dict(body), parse=FutureInfo.model_validate)


def train_job(tenant: str, job_id: str) -> Call:
    return Call(
        "POST",
        _model(tenant, "train_job"),
        json={"job_id": job_id},
        parse=FutureInfo.model_validate,
    )


def export(tenant: str) -> Call:
    return Call("GET", f"/v1/models/{tenant}/export", accept_msgpack=True, raw=True)
