"""The web dashboard: the page (``/dashboard``) and the JSON it polls.

The page and its script/style are served to anyone (they hold no data); the data
endpoint ``/v1/dashboard/state`` needs a key. An admin key sees every tenant, the
service-wide queue and utilization numbers and the Health Manager's events; a tenant
key sees only its own tenant: its workloads, job counts, Training Queue partitions,
usage, utilization and curves. The Inference Queue's depth and in-flight count are
service-wide aggregates (no tenant identity) and are shown to every viewer.

The page reads the key from the address's fragment (``/dashboard#key=jnx_...``, which
browsers never send to a server; the script drops it from the address bar at once) or
a small login form, and keeps it in ``sessionStorage``; it sends it as a bearer header.
A key in the query (``/dashboard?key=``, old links) is never used by the server: the
page answers 303 to the same address with the key moved into the fragment, and the
access log redacts it (:mod:`joynexus.server.accesslog`). Its Content-Security-Policy
allows only same-origin scripts, styles and requests.

Every source is optional: without a Master there are no workloads, without a usage
meter no usage, without a Health Manager no health section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field

from joynexus.api import TenantUsage, WorkloadStatus
from joynexus.errors import JoyNexusError, NotFoundError
from joynexus.server.dashboard import STATIC_DIR
from joynexus.server.dashboard.feed import CurvePoint, DashboardFeed, UtilizationTimeline
from joynexus.server.routes.metrics import METRICS, USAGE, Viewer, viewer_tenant
from joynexus.server.state import ServerState, State

if TYPE_CHECKING:
    from joynexus.master.service import MasterService
    from joynexus.metrics.events import MetricsService
    from joynexus.metrics.usage import UsageMeter
    from joynexus.runtime.health import HealthManager

__all__ = ["DASHBOARD", "HEALTH", "DashboardState", "router"]

#: ``ServiceRegistry.extras`` names this module reads (besides ``master``, ``metrics``
#: and ``usage``).
DASHBOARD = "dashboard"
HEALTH = "health"
_MAX_HEALTH_EVENTS = 200

router = APIRouter(tags=["dashboard"])

# The page's files: a fixed allow-list, so no request path reaches the file system.
_FILES = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    # The key may sit in the page's address (#key=) until the script removes it.
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


class TenantView(BaseModel):
    """One tenant as the dashboard shows it."""

    model_config = ConfigDict(extra="forbid")

    tenant_id: str
    workloads: list[WorkloadStatus]
    jobs_by_state: dict[str, int]
    queue_bytes: int = Field(description="bytes in the tenant's Training Queue partitions")
    queue_partitions: int
    usage: TenantUsage | None
    curves: dict[str, list[CurvePoint]] = Field(
        description="learning signal name -> points (step = policy version)"
    )


class QueueDepths(BaseModel):
    model_config = ConfigDict(extra="forbid")

    training_queue_bytes: int = Field(description="bytes held in the visible partitions")
    training_queue_partitions: int
    inference_queue_depth: int | None = Field(description="requests waiting (service-wide)")
    inference_in_flight: int | None = Field(description="predicts accepted, not answered")


# Mirrors of the Health Manager's records (joynexus.runtime imports torch; this router
# must stay importable in a control process that holds no model).
class HealthRoleView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str
    state: str
    restarts: int
    budget: int
    last_heartbeat: float
    shared: bool


class HealthEventView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int
    time: float
    role: str
    kind: str
    detail: str
    restarts: int


class HealthView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    roles: list[HealthRoleView]
    events: list[HealthEventView] = Field(description="the most recent events, oldest first")


class DashboardState(BaseModel):
    """Everything the dashboard page draws, as one viewer may see it."""

    model_config = ConfigDict(extra="forbid")

    generated_at: float
    viewer: Literal["admin", "tenant"]
    tenant_id: str | None = Field(description="the tenant of a tenant key; None for admins")
    tenants: list[TenantView]
    jobs_by_state: dict[str, int] = Field(description="summed over the visible tenants")
    queues: QueueDepths
    utilization: UtilizationTimeline | None
    health: HealthView | None


def _master(state: ServerState) -> MasterService | None:
    return state.services.master


def _latest(metrics: MetricsService | None, name: str) -> int | None:
    if metrics is None:
        return None
    event = metrics.latest(name, category="control")
    return None if event is None else int(event.value)


def _tenant_ids(state: ServerState, scope: str | None) -> list[str]:
    if scope is not None:
        return [scope]
    return [t.tenant_id for t in state.services.tenants.list_tenants()]


def _partitions_by_tenant(state: ServerState) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for info in state.gateway.queue.partitions():
        owner = state.gateway.partitions.owner(info.partition_id) or ""
        count, nbytes = out.get(owner, (0, 0))
        out[owner] = (count + 1, nbytes + info.nbytes)
    return out


def build_state(state: ServerState, viewer: Viewer, scope: str | None) -> DashboardState:
    """The dashboard's data for ``viewer``, limited to tenant ``scope`` (None: all)."""
    extras: dict[str, Any] = state.services.extras
    master = _master(state)
    metrics: MetricsService | None = extras.get(METRICS)
    meter: UsageMeter | None = extras.get(USAGE)
    feed: DashboardFeed | None = extras.get(DASHBOARD)
    health: HealthManager | None = extras.get(HEALTH)

    counters = state.gateway.scheduler.counters()
    by_tenant: dict[str, dict[str, int]] = counters["by_tenant"]
    usage = meter.report() if meter is not None else None
    partitions = _partitions_by_tenant(state)
    tenants: list[TenantView] = []
    for tid in _tenant_ids(state, scope):
        workloads: list[WorkloadStatus] = []
        if master is not None:
            try:
                workloads = master.reporter.list_workloads(tid)
            except JoyNexusError:
                workloads = []
        count, nbytes = partitions.get(tid, (0, 0))
        tenants.append(
            TenantView(
                tenant_id=tid,
                workloads=workloads,
                jobs_by_state=dict(by_tenant.get(tid, {})),
                queue_bytes=nbytes,
                queue_partitions=count,
                usage=None if usage is None else usage.tenants.get(tid, TenantUsage(tenant_id=tid)),
                curves={} if feed is None else feed.curves(tid),
            )
        )
    if scope is None:
        jobs_by_state = dict(counters["by_state"])
        queue_bytes = state.gateway.queue.nbytes
        queue_partitions = sum(c for c, _ in partitions.values())
    else:
        jobs_by_state = dict(by_tenant.get(scope, {}))
        queue_partitions, queue_bytes = partitions.get(scope, (0, 0))
    health_view = None
    if health is not None and viewer.role == "admin":
        health_view = HealthView(
            roles=[HealthRoleView.model_validate(r.model_dump()) for r in health.status()],
            events=[
                HealthEventView.model_validate(e.model_dump())
                for e in health.events[-_MAX_HEALTH_EVENTS:]
            ],
        )
    return DashboardState(
        generated_at=state.clock.wall(),
        viewer=viewer.role,
        tenant_id=viewer.tenant_id,
        tenants=tenants,
        jobs_by_state=jobs_by_state,
        queues=QueueDepths(
            training_queue_bytes=queue_bytes,
            training_queue_partitions=queue_partitions,
            inference_queue_depth=_latest(metrics, "inference_queue.depth"),
            inference_in_flight=_latest(metrics, "inference_queue.in_flight"),
        ),
        utilization=None if feed is None else feed.utilization(scope),
        health=health_view,
    )


@router.get("/v1/dashboard/state", response_model=DashboardState)
async def dashboard_state(
    principal: Viewer,
    state: State,
    tenant_id: Annotated[
        str | None, Query(max_length=64, description="Only this tenant (admin keys).")
    ] = None,
) -> DashboardState:
    """What the dashboard draws: tenants, workloads and states, job counts, queue depths,
    service utilization, learning curves and (admins) health events."""
    return build_state(state, principal, viewer_tenant(principal, tenant_id))


@router.get("/dashboard", include_in_schema=False, response_class=FileResponse)
async def dashboard_page(request: Request) -> Response:
    """The dashboard page (no data in it; its script fetches the state with a key).

    ``?key=`` (an old link) answers 303 to the page with the key in the fragment, which
    the browser keeps to itself: the key leaves the query (and every later request
    line) at once."""
    query = request.query_params
    if "key" in query:
        rest = urlencode([(k, v) for k, v in query.multi_items() if k != "key"])
        fragment = urlencode({"key": query["key"]})
        location = "/dashboard" + (f"?{rest}" if rest else "") + f"#{fragment}"
        return RedirectResponse(location, status_code=303, headers=_PAGE_HEADERS)
    return FileResponse(
        STATIC_DIR / "index.html",
        media_type="text/html; charset=utf-8",
        headers=_PAGE_HEADERS,
    )


@router.get("/dashboard/static/{name}", include_in_schema=False, response_class=FileResponse)
async def dashboard_file(name: str) -> FileResponse:
    """The page's script and style sheet (a fixed allow-list of names)."""
    media_type = _FILES.get(name)
    if media_type is None:
        raise NotFoundError(f"no dashboard file {name!r}; the page has {sorted(_FILES)}")
    return FileResponse(STATIC_DIR / name, media_type=media_type, headers=_PAGE_HEADERS)
