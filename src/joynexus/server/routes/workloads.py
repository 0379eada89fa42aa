"""Workloads: the high-level API over the Master Service (paper §4.1, upper layer).

A tenant submits a workload spec (JSON or msgpack; ``spec.tenant`` must be the caller),
lists and reads its workloads, pauses / resumes / cancels them, reads their status,
metrics and artifacts (files of its own output directory only). Every route reaches
the Master through the tenant gateway (503 when the server has none). Another tenant's
workload id answers 404 exactly as an unknown one does (:func:`joynexus.errors.unknown_id`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict

from joynexus.api import WorkloadMetrics, WorkloadStatus
from joynexus.errors import (
    InvalidRequestError,
    JoyNexusError,
    NotFoundError,
    PermissionDeniedError,
    unknown_id,
)
from joynexus.server.disk_quota import check_disk_quota
from joynexus.server.envpolicy import check_workload_env
from joynexus.server.names import PathName
from joynexus.server.state import (
    AnyPrincipal,
    ServerState,
    State,
    TenantPrincipal,
    as_tenant,
    tenant_id_of,
)
from joynexus.server.wire import decode_body, tensor_body
from joynexus.spec.workload import WorkloadSpec

if TYPE_CHECKING:
    from joynexus.master.service import MasterService

router = APIRouter(prefix="/v1/workloads", tags=["workloads"])

_MAX_ARTIFACTS = 10_000


class WorkloadDetail(BaseModel):
    """A workload's status and the spec it runs (as compiled by the server)."""

    model_config = ConfigDict(extra="forbid")

    status: WorkloadStatus
    spec: dict[str, Any]


class ArtifactInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    size: int


def master_of(state: ServerState) -> MasterService:
    """The Master behind the tenant gateway (503 when this server has none)."""
    return state.gateway.master


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=WorkloadStatus,
    openapi_extra=tensor_body(WorkloadSpec),
)
async def create_workload(
    request: Request, principal: AnyPrincipal, state: State
) -> WorkloadStatus:
    """Validate and start a workload (rl, sft, eval or custom) for the calling tenant."""
    if principal.role == "tenant":
        as_tenant(state, principal)  # rate-limited before its body is read
    spec = await decode_body(
        request,
        WorkloadSpec,
        max_body_bytes=min(state.config.max_body_bytes, 1 << 20),
        max_tensor_bytes=0,
    )
    if principal.role != "tenant" or principal.tenant_id is None:
        raise _not_a_tenant_key(state, spec.tenant)
    # Before the Master compiles it: compiling a gym spec builds the env once.
    check_workload_env(state, spec.env)
    tenant = tenant_id_of(principal)
    await check_disk_quota(state, tenant)  # past its disk quota: 429 disk_bytes
    return await master_of(state).lifecycle.submit(spec, tenant)


def _not_a_tenant_key(state: ServerState, tenant: str) -> JoyNexusError:
    """Why an admin key cannot submit ``tenant``'s workload, and what to do instead."""
    try:
        state.services.tenants.get_tenant(tenant)
    except NotFoundError:
        return NotFoundError(
            f"tenant {tenant!r} does not exist; create it with the admin key "
            f"(`joynexus tenants create {tenant}`), then submit with the API key it prints",
            tenant_id=tenant,
        )
    return PermissionDeniedError(
        f"workloads are submitted with the tenant's own key: submit with {tenant!r}'s API "
        f"key (the one `joynexus tenants create {tenant}` printed), not an admin key"
    )


@router.get("", response_model=list[WorkloadStatus])
async def list_workloads(principal: TenantPrincipal, state: State) -> list[WorkloadStatus]:
    """The calling tenant's workloads, oldest first."""
    return master_of(state).reporter.list_workloads(tenant_id_of(principal))


@router.get("/{workload_id}", response_model=WorkloadDetail)
async def get_workload(
    workload_id: PathName, principal: TenantPrincipal, state: State
) -> WorkloadDetail:
    """One workload: status and compiled spec."""
    master = master_of(state)
    tenant = tenant_id_of(principal)
    st = master.reporter.status(tenant, workload_id)
    return WorkloadDetail(status=st, spec=master.reporter.spec_of(tenant, workload_id))


@router.get("/{workload_id}/status", response_model=WorkloadStatus)
async def workload_status(
    workload_id: PathName, principal: TenantPrincipal, state: State
) -> WorkloadStatus:
    """State and progress: jobs completed / target, in flight, policy version."""
    return master_of(state).reporter.status(tenant_id_of(principal), workload_id)


@router.post("/{workload_id}/pause", response_model=WorkloadStatus)
async def pause_workload(
    workload_id: PathName, principal: TenantPrincipal, state: State
) -> WorkloadStatus:
    """Stop new job reservations (jobs in flight finish)."""
    return await master_of(state).lifecycle.pause(tenant_id_of(principal), workload_id)


@router.post("/{workload_id}/resume", response_model=WorkloadStatus)
async def resume_workload(
    workload_id: PathName, principal: TenantPrincipal, state: State
) -> WorkloadStatus:
    """Let a paused workload reserve jobs again."""
    return await master_of(state).lifecycle.resume(tenant_id_of(principal), workload_id)


@router.post("/{workload_id}/cancel", response_model=WorkloadStatus)
async def cancel_workload(
    workload_id: PathName, principal: TenantPrincipal, state: State
) -> WorkloadStatus:
    """Stop the workload; release its sessions, partitions and slot."""
    return await master_of(state).lifecycle.cancel(tenant_id_of(principal), workload_id)


@router.get("/{workload_id}/metrics", response_model=WorkloadMetrics)
async def workload_metrics(
    workload_id: PathName,
    principal: TenantPrincipal,
    state: State,
    kind: Annotated[str | None, Query(max_length=64, pattern=r"^[a-z_.]+$")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> WorkloadMetrics:
    """The workload's metrics records (JSONL lines, newest ``limit``) and a summary."""
    return master_of(state).reporter.metrics(tenant_id_of(principal), workload_id, kind, limit)


def _files(root: Path) -> list[ArtifactInfo]:
    out: list[ArtifactInfo] = []
    if not root.is_dir():
        return out
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out.append(
                ArtifactInfo(path=path.relative_to(root).as_posix(), size=path.stat().st_size)
            )
            if len(out) >= _MAX_ARTIFACTS:
                break
    return out


@router.get("/{workload_id}/artifacts", response_model=list[ArtifactInfo])
async def list_artifacts(
    workload_id: PathName, principal: TenantPrincipal, state: State
) -> list[ArtifactInfo]:
    """Files of the tenant's output directory (checkpoints, metrics, manifests)."""
    root = master_of(state).reporter.artifact_root(tenant_id_of(principal), workload_id)
    return _files(root)


@router.get(
    "/{workload_id}/artifacts/{path:path}",
    response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def download_artifact(
    workload_id: PathName, path: str, principal: TenantPrincipal, state: State
) -> FileResponse:
    """One file of the tenant's output directory (paths as ``list_artifacts`` gives them)."""
    root = master_of(state).reporter.artifact_root(tenant_id_of(principal), workload_id)
    parts = Path(path).parts
    if not path or len(path) > 1024 or path.startswith("/") or ".." in parts or "\x00" in path:
        raise InvalidRequestError(
            f"artifact path {path!r} must be relative to the tenant's output directory, "
            "without '..' (use a path from the artifact list)",
            field="path",
        )
    base = root.resolve()
    target = (base / path).resolve()
    if not target.is_relative_to(base):
        raise PermissionDeniedError(
            "artifact path leaves the tenant's output directory", field="path"
        )
    if not target.is_file():
        raise unknown_id("artifact", path)
    return FileResponse(target, media_type="application/octet-stream", filename=target.name)
