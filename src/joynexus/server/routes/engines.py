"""Rollout engines: an admin reads and scales the plane's inference engine pool.

``GET /v1/admin/engines`` lists the engines (state, admission weight, outstanding
calls); ``POST /v1/admin/engines {"engines": n}`` scales the pool to ``n``. Scaling out
starts engines, syncs every tenant's published weights to them and admits them
gradually; scaling in drains: a leaving engine takes no new request and is released
once the requests it holds have finished. Scaling operations are serialized and
rolled back on failure. The routes reach the plane through
``ServiceRegistry.extras["plane"]`` (503 when the server has none; 409 when its
placement has no engine pool).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from joynexus.errors import CapacityError, ConflictError
from joynexus.runtime.scaling import EngineStatus
from joynexus.server.state import AdminPrincipal, ServerState, State

if TYPE_CHECKING:
    from joynexus.runtime.plane import ExecutionPlane

__all__ = ["PLANE", "EnginePoolState", "EngineScale", "router"]

#: ``ServiceRegistry.extras`` key of the execution plane.
PLANE = "plane"

router = APIRouter(prefix="/v1/admin/engines", tags=["admin"])


class EngineScale(BaseModel):
    """The pool size to scale to."""

    model_config = ConfigDict(extra="forbid")

    engines: int = Field(ge=1, le=4096, description="rollout engines after the operation")


class EnginePoolState(BaseModel):
    """The rollout-engine pool."""

    model_config = ConfigDict(extra="forbid")

    engines: int = Field(description="engines in the pool (draining ones included)")
    max_engines: int | None = Field(description="upper bound of the pool (null: none)")
    pool: list[EngineStatus]


def _plane(state: ServerState) -> ExecutionPlane:
    plane: ExecutionPlane = state.service(PLANE)
    return plane


def _pool_state(plane: ExecutionPlane) -> EnginePoolState:
    engines = plane.engine_status()  # ConflictError (409) without a pool
    assert plane.pool is not None
    return EnginePoolState(engines=len(engines), max_engines=plane.pool.max_engines, pool=engines)


@router.get("", response_model=EnginePoolState)
async def get_engines(principal: AdminPrincipal, state: State) -> EnginePoolState:
    """The rollout-engine pool (admin key)."""
    return _pool_state(_plane(state))


@router.post("", response_model=EnginePoolState)
async def scale_engines(
    body: EngineScale, principal: AdminPrincipal, state: State
) -> EnginePoolState:
    """Scale the rollout-engine pool to ``engines`` (admin key); answers once done.

    Errors: 422 for fewer than one engine, 409 above the pool's bound or without an
    engine pool, 503 when an engine fails to start and 504 when a leaving engine does
    not drain in time (both rolled back to the previous engines).
    """
    plane = _plane(state)
    try:
        await plane.scale_rollout(body.engines)
    except CapacityError as exc:
        # Above the placement's bound: the request conflicts with how the server was
        # started and retrying cannot help (CapacityError's 429 would invite retries).
        bound = plane.pool.max_engines if plane.pool is not None else None
        raise ConflictError(exc.message, max_engines=bound) from exc
    return _pool_state(plane)
