"""Prometheus ``/metrics`` and per-tenant usage metering ``/v1/usage`` (paper §4.1.3, §6).

``/metrics`` is the Metrics Service's Prometheus registry in the text exposition
format: control signals (job states, queue depth, in-flight requests, staleness),
learning signals (loss, return, evaluation scores), system signals (latencies,
utilization) and the usage meter's ``joynexus_usage_*`` counters. Every family is
either service-wide (no ``tenant`` label) or labelled with a ``tenant`` id, never both,
so a sum over tenants counts each number once; none carries a key, a job or session id,
a path or any request content.

Authentication of ``/metrics``: Prometheus scrapers usually call it without
credentials, so by default it is **unauthenticated** and unversioned, like the probes
(``/healthz``). The tenant ids in its labels are then visible to whoever reaches the
port: bind the server to a private interface, or build the server with
``metrics_auth="admin"`` (``joynexus serve --metrics-auth admin``), which requires an
admin key (``Authorization: Bearer``; Prometheus's ``authorization`` scrape setting).

``/v1/usage`` needs a key: a tenant key sees only its own usage, an admin key every
tenant's (optionally filtered with ``?tenant_id=``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import APIRouter, Depends, Query, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from joynexus.api import TenantUsage, UsageReport
from joynexus.errors import AuthenticationError, PermissionDeniedError
from joynexus.server.auth import Principal
from joynexus.server.state import ServerState, State

if TYPE_CHECKING:
    from joynexus.metrics.events import MetricsService
    from joynexus.metrics.usage import UsageMeter

__all__ = [
    "METRICS",
    "METRICS_AUTH",
    "USAGE",
    "MetricsAuth",
    "Viewer",
    "router",
    "scoped_usage",
    "viewer_tenant",
]

#: ``ServiceRegistry.extras`` names this module reads.
METRICS = "metrics"
USAGE = "usage"
METRICS_AUTH = "metrics_auth"

MetricsAuth = Literal["none", "admin"]
_PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

router = APIRouter(tags=["metrics"])

# Same scheme name as the other routes' bearer ("HTTPBearer"), so the OpenAPI document
# keeps one security scheme.
_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer jnx_...`")


def _authenticate(
    state: ServerState, credentials: HTTPAuthorizationCredentials | None
) -> Principal:
    if credentials is None:
        raise AuthenticationError(
            "missing API key; send the header 'Authorization: Bearer <api key>'"
        )
    principal = state.services.tenants.authenticate(credentials.credentials)
    if principal is None:
        raise AuthenticationError("invalid or revoked API key")
    return principal


def _viewer(
    state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    principal = _authenticate(state, credentials)
    if principal.role == "tenant":
        # Read endpoints the dashboard polls still spend the tenant's request budget.
        assert principal.tenant_id is not None
        state.quotas.take_request(principal.tenant_id, state.quotas_of(principal.tenant_id))
    return principal


#: A route parameter for read views: an admin key sees every tenant, a tenant key only
#: its own (see :func:`viewer_tenant`).
Viewer = Annotated[Principal, Depends(_viewer)]


def viewer_tenant(principal: Principal, requested: str | None) -> str | None:
    """The one tenant a view shows (None: every tenant, admins only).

    Raises:
        PermissionDeniedError: a tenant key asked for another tenant.
    """
    if principal.role == "admin":
        return requested
    if requested is not None and requested != principal.tenant_id:
        raise PermissionDeniedError(
            f"a tenant key reads only its own tenant ({principal.tenant_id!r}), not {requested!r}",
            field="tenant_id",
        )
    return principal.tenant_id


def scoped_usage(report: UsageReport, tenant_id: str | None) -> UsageReport:
    """``report`` as one tenant may see it: its own row, and service totals that are its
    own (so other tenants' load is not disclosed); unchanged for ``None``."""
    if tenant_id is None:
        return report
    own = report.tenants.get(tenant_id, TenantUsage(tenant_id=tenant_id))
    return UsageReport(
        started_at=report.started_at,
        generated_at=report.generated_at,
        tenants={tenant_id: own},
        service_seconds=dict(own.device_seconds),
    )


@router.get(
    "/metrics",
    include_in_schema=False,  # Prometheus text, not a JSON API (documented in docs/)
    response_class=Response,
)
async def prometheus_metrics(
    state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Response:
    """Prometheus text exposition of the Metrics Service (see module docstring)."""
    auth: MetricsAuth = state.services.extras.get(METRICS_AUTH, "none")
    if auth == "admin":
        principal = _authenticate(state, credentials)
        if principal.role != "admin":
            raise PermissionDeniedError("/metrics on this server needs an admin API key")
    metrics: MetricsService = state.service(METRICS)
    return Response(content=metrics.render_latest(), media_type=_PROMETHEUS_CONTENT_TYPE)


@router.get("/v1/usage", response_model=UsageReport, tags=["usage"])
async def usage(
    principal: Viewer,
    state: State,
    tenant_id: Annotated[
        str | None, Query(max_length=64, description="Only this tenant (admin keys).")
    ] = None,
) -> UsageReport:
    """Per-tenant device-seconds on each shared service, requests, samples trained and
    environment steps. A tenant key sees only its own usage; an admin key every tenant's."""
    meter: UsageMeter = state.service(USAGE)
    scope = viewer_tenant(principal, tenant_id)
    return scoped_usage(meter.report(), scope)
