"""Training Scheduler primitives (paper Appendix A.2–A.6) on the tenant's own jobs.

A job belongs to the tenant that reserved it: the server sets ``tenant_id`` from the
API key, so nobody reserves in another tenant's name. Producer and consumer roles are
namespaced per tenant inside the scheduler (``<tenant>/<role>``), which is what keeps
``lease`` and ``lease_stage`` — which pick *any* waiting job of a role — from handing
one tenant another tenant's job. Responses show the roles as the tenant wrote them.
Another tenant's job id answers 404 exactly as an unknown one does.

A job's ``metadata`` is stored with it for good: its serialized JSON is bounded by
``ServerConfig.max_job_metadata_bytes`` (413), its nesting by
:data:`~joynexus.utils.jsondepth.MAX_JSON_DEPTH` levels (422), and every integer field is
bounded (422) so nothing beyond SQLite's 64-bit INTEGER reaches the scheduler; all of it
is checked before the scheduler is called.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, status
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from joynexus.control.job import JobState, TaskType, TrainingJob, unicode_problem
from joynexus.errors import PayloadTooLargeError, QuotaExceededError
from joynexus.server.config import MAX_API_INT
from joynexus.server.names import Name, PathName
from joynexus.server.state import ServerState, State, TenantPrincipal, tenant_id_of
from joynexus.utils.jsondepth import MAX_JSON_DEPTH, check_json_depth

router = APIRouter(prefix="/v1/scheduler", tags=["training-scheduler"])


def _valid_text(metadata: dict[str, Any]) -> dict[str, Any]:
    # Refused before anything is stored: a lone surrogate stored with a job, or metadata
    # nested past what pydantic serializes, would make every later answer that includes
    # the job fail to encode. The depth first: the text check recurses.
    check_json_depth(metadata, MAX_JSON_DEPTH, "metadata")
    bad = unicode_problem(metadata)
    if bad is not None:
        raise ValueError(
            f"{bad} holds a string that is not valid Unicode (a lone surrogate such as "
            "\\ud800); send UTF-8 text"
        )
    return metadata


Metadata = Annotated[dict[str, Any], AfterValidator(_valid_text)]
Epoch = Annotated[int, Field(ge=0, le=2**62)]
Version = Annotated[int, Field(ge=0, le=MAX_API_INT)]
Reason = Annotated[str, Field(min_length=1, max_length=256)]


class ReserveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy_key: Name
    domain: Name
    task_type: TaskType
    sample_count: int = Field(ge=0, le=10**9)
    producer_role: Name
    consumer_role: Name
    behavior_policy_version: Version | None = None
    max_policy_staleness: Version | None = None
    metadata: Metadata = Field(
        default_factory=dict,
        max_length=64,
        description=(
            "stored with the job; serialized JSON of at most max_job_metadata_bytes, "
            f"nested at most {MAX_JSON_DEPTH} levels"
        ),
    )


class MarkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: JobState
    lease_epoch: Epoch | None = None


class EpochIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lease_epoch: Epoch | None = None


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lease_epoch: Epoch


class CompleteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lease_epoch: Epoch | None = None
    metadata: Metadata = Field(default_factory=dict, max_length=64)


class TerminateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Reason
    lease_epoch: Epoch | None = None


class LeaseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    consumer_role: Name
    domains: list[Name] = Field(min_length=1, max_length=64)
    wait_s: float = Field(default=0.0, ge=0, le=3600, description="long-poll for a ready job")


class LeaseStageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: JobState
    leased_state: JobState
    consumer_role: Name
    domain: Name


class LeaseOut(BaseModel):
    """The leased job, or ``null`` when none was waiting."""

    model_config = ConfigDict(extra="forbid")

    job: TrainingJob | None


def _role(tenant: str, role: str) -> str:
    return f"{tenant}/{role}"


def _out(job: TrainingJob) -> TrainingJob:
    def strip(role: str) -> str:
        prefix = f"{job.tenant_id}/"
        return role[len(prefix) :] if role.startswith(prefix) else role

    return job.model_copy(
        update={
            "producer_role": strip(job.producer_role),
            "consumer_role": strip(job.consumer_role),
        }
    )


def _check_metadata(state: ServerState, metadata: dict[str, Any]) -> None:
    """Refuse job metadata whose serialized JSON exceeds ``max_job_metadata_bytes``."""
    limit = state.config.max_job_metadata_bytes
    try:
        size = len(json.dumps(metadata, sort_keys=True).encode())
    except (TypeError, ValueError):
        return  # not JSON data: the scheduler refuses it with the reason
    if size > limit:
        raise PayloadTooLargeError(
            f"job metadata of {size} bytes (serialized JSON) exceeds the limit of {limit} "
            "bytes (max_job_metadata_bytes); keep large data in the Training Queue or in "
            "artifacts and put a reference in the metadata",
            field="metadata",
            limit_bytes=limit,
            size_bytes=size,
        )


@router.post("/jobs", status_code=status.HTTP_201_CREATED, response_model=TrainingJob)
async def reserve(body: ReserveIn, principal: TenantPrincipal, state: State) -> TrainingJob:
    """``reserve``: admit a job in ``reserved`` with a producer lease (epoch 1), or 429."""
    tenant = tenant_id_of(principal)
    _check_metadata(state, body.metadata)
    scheduler = state.gateway.scheduler
    by_tenant = scheduler.counters().get("by_tenant", {}).get(tenant, {})
    inflight = sum(
        n
        for s, n in by_tenant.items()
        if s not in (JobState.COMPLETED, JobState.FAILED, JobState.DROPPED)
    )
    state.quotas.check_count(
        tenant,
        "inflight_jobs",
        inflight,
        1,
        state.quotas_of(tenant).max_inflight_jobs,
        "unfinished training jobs",
    )
    # Reservations held open (producing) are bounded apart from the in-flight quota:
    # each holds a producer lease the tenant can keep alive for ever by heartbeats.
    held = sum(
        1
        for j in scheduler.list_jobs(tenant, JobState.RESERVED)
        if j.producer_role.startswith(f"{tenant}/")
    )
    state.quotas.check_count(
        tenant,
        "reserved_jobs",
        held,
        1,
        state.config.max_reserved_jobs_per_tenant,
        "jobs reserved by hand and not yet marked ready (server setting "
        "max_reserved_jobs_per_tenant)",
    )
    job = scheduler.reserve(
        policy_key=body.policy_key,
        domain=body.domain,
        tenant_id=tenant,
        task_type=body.task_type,
        sample_count=body.sample_count,
        producer_role=_role(tenant, body.producer_role),
        consumer_role=_role(tenant, body.consumer_role),
        behavior_policy_version=body.behavior_policy_version,
        max_policy_staleness=body.max_policy_staleness,
        metadata=body.metadata,
    )
    if job is None:
        reason = scheduler.last_refusal(tenant, body.task_type) or "admission"
        raise QuotaExceededError(
            f"the Training Scheduler refused the reservation: {reason}",
            reason=f"admission:{reason}",
            retry_after_s=1.0,
        )
    state.gateway.partitions.record_job(job.partition_id, tenant)
    return _out(job)


@router.get("/jobs", response_model=list[TrainingJob])
async def list_jobs(
    principal: TenantPrincipal,
    state: State,
    job_state: Annotated[JobState | None, Query(alias="state")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> list[TrainingJob]:
    """The calling tenant's jobs (terminal ones included), oldest first."""
    jobs = state.gateway.scheduler.list_jobs(tenant_id_of(principal), job_state, limit)
    return [_out(j) for j in jobs]


@router.get("/jobs/{job_id}", response_model=TrainingJob)
async def get_job(job_id: PathName, principal: TenantPrincipal, state: State) -> TrainingJob:
    """One job's descriptor (paper Table 3)."""
    return _out(state.gateway.job(tenant_id_of(principal), job_id))


@router.post("/jobs/{job_id}/mark", response_model=TrainingJob)
async def mark(
    job_id: PathName, body: MarkIn, principal: TenantPrincipal, state: State
) -> TrainingJob:
    """``mark``: move along a Table 4 edge that needs no lease grant."""
    job = state.gateway.mark(tenant_id_of(principal), job_id, body.state, body.lease_epoch)
    return _out(job)


@router.post("/jobs/{job_id}/hand_off", response_model=TrainingJob)
async def hand_off(
    job_id: PathName, body: EpochIn, principal: TenantPrincipal, state: State
) -> TrainingJob:
    """End production of a reserved RL job whose next stage is actor-forward."""
    return _out(state.gateway.hand_off(tenant_id_of(principal), job_id, body.lease_epoch))


@router.post("/jobs/{job_id}/heartbeat", response_model=TrainingJob)
async def heartbeat(
    job_id: PathName, body: HeartbeatIn, principal: TenantPrincipal, state: State
) -> TrainingJob:
    """Extend the live lease ``lease_epoch`` by one TTL."""
    return _out(state.gateway.heartbeat(tenant_id_of(principal), job_id, body.lease_epoch))


@router.post("/jobs/{job_id}/complete", response_model=TrainingJob)
async def complete(
    job_id: PathName, body: CompleteIn, principal: TenantPrincipal, state: State
) -> TrainingJob:
    """Finish a leased job; ``metadata`` is merged into the job's."""
    tenant = tenant_id_of(principal)
    job = state.gateway.job(tenant, job_id)
    if body.metadata:
        _check_metadata(state, {**job.metadata, **body.metadata})
    job = state.gateway.complete(tenant, job_id, body.lease_epoch, body.metadata or None)
    return _out(job)


@router.post("/jobs/{job_id}/fail", response_model=TrainingJob)
async def fail(
    job_id: PathName, body: TerminateIn, principal: TenantPrincipal, state: State
) -> TrainingJob:
    """Move a nonterminal job to ``failed`` with ``reason``."""
    tenant = tenant_id_of(principal)
    return _out(state.gateway.fail(tenant, job_id, body.reason, body.lease_epoch))


@router.post("/jobs/{job_id}/drop", response_model=TrainingJob)
async def drop(
    job_id: PathName, body: TerminateIn, principal: TenantPrincipal, state: State
) -> TrainingJob:
    """Drop a stale RL job (``ready`` or ``leased``)."""
    tenant = tenant_id_of(principal)
    return _out(state.gateway.drop(tenant, job_id, body.reason, body.lease_epoch))


@router.post("/lease", response_model=LeaseOut)
async def lease(body: LeaseIn, principal: TenantPrincipal, state: State) -> LeaseOut:
    """``lease_next``: the best ready job of the tenant's ``consumer_role`` in ``domains``."""
    tenant = tenant_id_of(principal)
    scheduler = state.gateway.scheduler
    role = _role(tenant, body.consumer_role)
    wait_s = min(body.wait_s, state.config.max_long_poll_s)
    job = scheduler.lease_next(role, body.domains)
    if (
        job is None
        and wait_s > 0
        and await scheduler.async_wait_for_ready(role, body.domains, wait_s)
    ):
        job = scheduler.lease_next(role, body.domains)
    return LeaseOut(job=None if job is None else _out(job))


@router.post("/lease_stage", response_model=LeaseOut)
async def lease_stage(body: LeaseStageIn, principal: TenantPrincipal, state: State) -> LeaseOut:
    """Lease the tenant's next job waiting in ``state`` into the stage ``leased_state``."""
    tenant = tenant_id_of(principal)
    job = state.gateway.scheduler.lease_stage(
        body.state, _role(tenant, body.consumer_role), body.domain, body.leased_state
    )
    return LeaseOut(job=None if job is None else _out(job))
