"""Polling and cancelling long operations (see :mod:`joynexus.server.futures`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from joynexus.server.futures import FutureStatus
from joynexus.server.names import PathName
from joynexus.server.state import State, TenantPrincipal, tenant_id_of

router = APIRouter(prefix="/v1/futures", tags=["futures"])


@router.get("", response_model=list[FutureStatus])
async def list_futures(principal: TenantPrincipal, state: State) -> list[FutureStatus]:
    """The calling tenant's futures (pending, and finished ones still retained; a finished
    one listed here expires soon after, as if it had been polled)."""
    return state.gateway.futures.list(tenant_id_of(principal))


@router.get("/{future_id}", response_model=FutureStatus)
async def get_future(
    future_id: PathName,
    principal: TenantPrincipal,
    state: State,
    wait: Annotated[float, Query(ge=0, le=3600, description="long-poll up to this many s")] = 0.0,
) -> FutureStatus:
    """A future's state; with ``wait`` the call returns early once it finishes. A finished
    future expires shortly after its result was first read (``DELETE`` forgets it now)."""
    wait_s = min(wait, state.config.max_long_poll_s)
    return await state.gateway.futures.get(tenant_id_of(principal), future_id, wait_s)


@router.delete("/{future_id}", response_model=FutureStatus)
async def delete_future(
    future_id: PathName, principal: TenantPrincipal, state: State
) -> FutureStatus:
    """Forget a finished future now (its last status is returned), or cancel a pending
    one (kept briefly so a poller sees ``cancelled``)."""
    return state.gateway.futures.delete(tenant_id_of(principal), future_id)
