"""What the routes share: the injected services and the server's own state.

Routes never construct services: :func:`~joynexus.server.app.create_app` receives a
:class:`ServiceRegistry` and puts a :class:`ServerState` on ``app.state``; routes reach
it through the FastAPI dependencies below. Adding a service (the Master, the model
services) is adding a field to :class:`ServiceRegistry` and a router that reads it —
the existing routes do not change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from joynexus.errors import AuthenticationError, PermissionDeniedError, ServiceUnavailableError
from joynexus.server.auth import Principal, TenantStore
from joynexus.server.config import ServerConfig, TenantQuotas
from joynexus.server.futures import FutureRegistry
from joynexus.server.gateway import TenantGateway
from joynexus.server.quotas import QuotaManager
from joynexus.utils.clock import Clock

if TYPE_CHECKING:  # the Training Queue and the Master import torch; the server must not
    from joynexus.control.scheduler import TrainingScheduler
    from joynexus.master.service import MasterService
    from joynexus.services.protocols import EnvironmentServiceAPI, TrainingQueueAPI

__all__ = [
    "AdminPrincipal",
    "ServerState",
    "ServiceRegistry",
    "TenantPrincipal",
    "get_state",
]


@dataclass
class ServiceRegistry:
    """The services one server exposes.

    Args:
        tenants: Tenants and API keys.
        scheduler: The Training Scheduler.
        training_queue: The Training Queue.
        environment: The Environment Service.
        master: The Master, where this server hosts workloads and model slots
            (``joynexus serve``); routes reach it through :class:`TenantGateway`.
        extras: Services added by later routers (looked up by name with
            :meth:`ServerState.service`), so new endpoints need no change here.
    """

    tenants: TenantStore
    scheduler: TrainingScheduler
    training_queue: TrainingQueueAPI
    environment: EnvironmentServiceAPI
    master: MasterService | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class ServerState:
    config: ServerConfig
    services: ServiceRegistry
    clock: Clock
    quotas: QuotaManager
    futures: FutureRegistry
    gateway: TenantGateway
    pending_sessions: dict[str, int] = field(default_factory=dict)

    def quotas_of(self, tenant_id: str) -> TenantQuotas:
        record = self.services.tenants.get_tenant(tenant_id)
        return record.quotas or self.config.default_quotas

    def service(self, name: str) -> Any:
        """An extra service by name; 503 when this server was built without it."""
        svc = self.services.extras.get(name)
        if svc is None:
            raise ServiceUnavailableError(f"this server has no {name} service", service=name)
        return svc


def get_state(request: Request) -> ServerState:
    state = request.app.state.joynexus
    assert isinstance(state, ServerState)
    return state


State = Annotated[ServerState, Depends(get_state)]

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer jnx_...`")


def _principal(
    state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None:
        raise AuthenticationError(
            "missing API key; send the header 'Authorization: Bearer <api key>'"
        )
    principal = state.services.tenants.authenticate(credentials.credentials)
    if principal is None:
        raise AuthenticationError("invalid or revoked API key")
    return principal


def as_tenant(state: ServerState, principal: Principal) -> Principal:
    """``principal`` acting as its tenant, one rate-limit token spent.

    Raises:
        PermissionDeniedError: not a tenant's key.
        QuotaExceededError: the tenant's request rate is spent.
    """
    if principal.role != "tenant" or principal.tenant_id is None:
        raise PermissionDeniedError("this endpoint acts as a tenant; use a tenant's API key")
    state.quotas.take_request(principal.tenant_id, state.quotas_of(principal.tenant_id))
    return principal


def _tenant(state: State, principal: Annotated[Principal, Depends(_principal)]) -> Principal:
    return as_tenant(state, principal)


def _admin(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
    if principal.role != "admin":
        raise PermissionDeniedError("this endpoint needs an admin API key")
    return principal


#: A route parameter that authenticates any key; the route decides what each role may do.
AnyPrincipal = Annotated[Principal, Depends(_principal)]
#: A route parameter that authenticates a tenant key and spends one rate-limit token.
TenantPrincipal = Annotated[Principal, Depends(_tenant)]
#: A route parameter that authenticates an admin key.
AdminPrincipal = Annotated[Principal, Depends(_admin)]


def tenant_id_of(principal: Principal) -> str:
    assert principal.tenant_id is not None
    return principal.tenant_id
