"""Liveness and readiness (unauthenticated, unversioned: probes call them)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from joynexus.server.state import State

router = APIRouter(tags=["health"])

#: Registry extra: a callable listing why the service is degraded (empty: it is not) —
#: a spent recovery budget, stalled workloads (``MasterHost.degraded``).
DEGRADED = "degraded"


class Health(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: str
    checks: dict[str, str] = {}


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up and answering."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(state: State) -> JSONResponse:
    """The injected services can take requests and no workload is degraded (503 with
    the failing checks otherwise: a spent recovery budget, a stalled workload)."""
    checks: dict[str, str] = {}
    try:
        state.services.scheduler.counters()
        checks["scheduler"] = "ok"
    except Exception as exc:  # a probe reports, it does not fail
        checks["scheduler"] = f"error: {type(exc).__name__}"
    try:
        state.services.tenants.list_keys("\x00")
        checks["tenants"] = "ok"
    except Exception as exc:
        checks["tenants"] = f"error: {type(exc).__name__}"
    degraded = state.services.extras.get(DEGRADED)
    if degraded is not None:
        why = degraded()
        checks["workloads"] = "degraded: " + "; ".join(why)[:500] if why else "ok"
    ok = all(v == "ok" for v in checks.values())
    body = Health(status="ok" if ok else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)
