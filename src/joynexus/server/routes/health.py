"""Liveness and readiness (unauthenticated, unversioned: probes call them)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from joynexus.server.state import State

router = APIRouter(tags=["health"])

#: Registry extra: a callable returning ``(why the plane is not ready or None, counts)``
#: (``MasterHost.readiness``). The probe is unauthenticated: it says counts, never a
#: tenant's workload or session ids.
READINESS = "readiness"


class Health(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: str
    checks: dict[str, str] = {}
    counts: dict[str, int] | None = None


@router.get("/healthz", response_model=Health, response_model_exclude_none=True)
async def healthz() -> Health:
    """The process is up and answering."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(state: State) -> JSONResponse:
    """The injected services can take requests and the execution plane is up (503 with
    the failing checks otherwise: a spent recovery budget). Stalled workloads are
    counted in ``counts``; they are their tenants' state, not the server's."""
    checks: dict[str, str] = {}
    try:
        state.gateway.scheduler.counters()
        checks["scheduler"] = "ok"
    except Exception as exc:  # a probe reports, it does not fail
        checks["scheduler"] = f"error: {type(exc).__name__}"
    try:
        state.services.tenants.list_keys("\x00")
        checks["tenants"] = "ok"
    except Exception as exc:
        checks["tenants"] = f"error: {type(exc).__name__}"
    counts: dict[str, int] = {}
    readiness = state.services.extras.get(READINESS)
    if readiness is not None:
        down, counts = readiness()
        checks["plane"] = "ok" if down is None else f"degraded: {down}"
    ok = all(v == "ok" for v in checks.values())
    body = Health(status="ok" if ok else "unavailable", checks=checks, counts=counts)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)
