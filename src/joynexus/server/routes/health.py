"""Liveness and readiness (unauthenticated, unversioned: probes call them)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from joynexus.server.state import State

router = APIRouter(tags=["health"])


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
    """The injected services can take requests (503 with the failing checks otherwise)."""
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
    ok = all(v == "ok" for v in checks.values())
    body = Health(status="ok" if ok else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)
