"""Tenants and API keys: admins create and list; a tenant reads its own record."""

from __future__ import annotations

from fastapi import APIRouter, status
from pydantic import BaseModel, ConfigDict

from joynexus.errors import NotFoundError
from joynexus.server.auth import IssuedKey, KeyRecord, TenantRecord
from joynexus.server.config import TenantQuotas
from joynexus.server.names import Name, PathName, TenantId
from joynexus.server.state import AdminPrincipal, State, TenantPrincipal, tenant_id_of

router = APIRouter(prefix="/v1", tags=["tenants"])


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: TenantId
    quotas: TenantQuotas | None = None


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: Name | None = None


class KeyInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key_id: str
    role: str
    tenant_id: str | None
    created_at: float
    revoked: bool
    label: str


class NewKey(BaseModel):
    """A new API key: ``api_key`` is shown only in this response."""

    model_config = ConfigDict(extra="forbid")

    api_key: str
    key: KeyInfo


class TenantInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str
    created_at: float
    quotas: TenantQuotas


class TenantCreated(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: TenantInfo
    api_key: str
    key: KeyInfo


def _key(record: KeyRecord) -> KeyInfo:
    return KeyInfo(
        key_id=record.key_id,
        role=record.role,
        tenant_id=record.tenant_id,
        created_at=record.created_at,
        revoked=record.revoked,
        label=record.label,
    )


def _tenant(state: State, record: TenantRecord) -> TenantInfo:
    return TenantInfo(
        tenant_id=record.tenant_id,
        created_at=record.created_at,
        quotas=record.quotas or state.config.default_quotas,
    )


def _issued(issued: IssuedKey) -> NewKey:
    return NewKey(api_key=issued.api_key, key=_key(issued.record))


@router.post("/tenants", status_code=status.HTTP_201_CREATED, response_model=TenantCreated)
async def create_tenant(body: TenantCreate, _: AdminPrincipal, state: State) -> TenantCreated:
    """Create a tenant and its first API key (admin)."""
    store = state.services.tenants
    record = store.create_tenant(body.tenant_id, quotas=body.quotas)
    issued = store.create_key(record.tenant_id, label="initial")
    return TenantCreated(
        tenant=_tenant(state, record), api_key=issued.api_key, key=_key(issued.record)
    )


@router.get("/tenants", response_model=list[TenantInfo])
async def list_tenants(_: AdminPrincipal, state: State) -> list[TenantInfo]:
    """Every tenant (admin)."""
    return [_tenant(state, r) for r in state.services.tenants.list_tenants()]


@router.get("/tenants/{tenant_id}/keys", response_model=list[KeyInfo])
async def list_keys(tenant_id: PathName, _: AdminPrincipal, state: State) -> list[KeyInfo]:
    """A tenant's keys, without secrets (admin)."""
    state.services.tenants.get_tenant(tenant_id)
    return [_key(k) for k in state.services.tenants.list_keys(tenant_id)]


@router.post(
    "/tenants/{tenant_id}/keys", status_code=status.HTTP_201_CREATED, response_model=NewKey
)
async def create_key(
    tenant_id: PathName, body: KeyCreate, _: AdminPrincipal, state: State
) -> NewKey:
    """Issue another API key for a tenant (admin)."""
    return _issued(state.services.tenants.create_key(tenant_id, label=body.label or ""))


@router.delete("/tenants/{tenant_id}/keys/{key_id}", status_code=status.HTTP_204_NO_CONTENT)
async def revoke_key(
    tenant_id: PathName, key_id: PathName, _: AdminPrincipal, state: State
) -> None:
    """Revoke one of a tenant's keys (admin); requests with it answer 401 at once."""
    keys = {k.key_id for k in state.services.tenants.list_keys(tenant_id)}
    if key_id not in keys:
        raise NotFoundError(f"tenant {tenant_id!r} has no API key {key_id!r}", key_id=key_id)
    state.services.tenants.revoke_key(key_id)


@router.get("/me", response_model=TenantInfo)
async def me(principal: TenantPrincipal, state: State) -> TenantInfo:
    """The calling tenant and its quotas."""
    return _tenant(state, state.services.tenants.get_tenant(tenant_id_of(principal)))
