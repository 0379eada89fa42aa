"""Training Queue primitives (paper Figure 4, Appendix A.5) on the tenant's partitions.

``put`` appends samples (msgpack or JSON tensors, one leading sample dimension), the
two-step read is ``get_meta`` (JSON: which samples) then ``get_data`` (their tensors),
``put_fields`` writes derived fields (advantages, returns) against a ``BatchMeta``,
and ``DELETE`` clears a partition. Every sample's ``SampleMeta.tenant_id`` is the
caller: a tenant cannot write samples in another tenant's name.

Bounds: a tenant owns at most ``max_partitions`` partitions and ``max_queue_bytes``
bytes (its quotas, 429 ``quota_exceeded``), and no write takes the whole queue above
``ServerConfig.queue_memory_cap_bytes`` (429 ``memory_cap_exceeded``). Reads are
bounded per call (``max_response_bytes``, in the answer's encoding) and over time (the
tenant's ``read_bytes_per_s`` / ``read_burst_bytes``, 429 ``quota_exceeded`` reason
``read_bytes``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Request, status
from pydantic import BaseModel, ConfigDict, Field

from joynexus.errors import LimitExceededError, MemoryCapExceededError
from joynexus.queues.meta import BatchMeta, PartitionInfo, SampleMeta
from joynexus.server.config import MAX_API_INT
from joynexus.server.names import Name, PathName
from joynexus.server.state import ServerState, State, TenantPrincipal, tenant_id_of
from joynexus.server.wire import (
    Tensor,
    answer_nbytes,
    decode_body,
    respond,
    tensor_body,
    tensor_response,
    wants_msgpack,
)

router = APIRouter(prefix="/v1/queue/partitions", tags=["training-queue"])

_MAX_FIELDS = 64

#: A policy version or sample index: bounded, so no int beyond 64 bits reaches a service.
Version = Annotated[int, Field(ge=0, le=MAX_API_INT)]
Index = Annotated[int, Field(ge=0, le=MAX_API_INT)]


class SampleMetaIn(BaseModel):
    """A sample's identity; the server fills ``tenant_id`` with the caller."""

    model_config = ConfigDict(extra="forbid")

    schema_signature: Annotated[str, Field(min_length=1, max_length=256)]
    behavior_policy_version: Version | None = None


class PutIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: dict[Name, Tensor] = Field(
        min_length=1, max_length=_MAX_FIELDS, description="field -> [N, ...] array"
    )
    metadata: SampleMetaIn | list[SampleMetaIn] = Field(
        description="one for all N samples, or exactly N"
    )


class PutOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    partition_id: str
    indexes: list[int]


class GetMetaIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fields: list[Name] = Field(min_length=1, max_length=_MAX_FIELDS)
    batch_size: int = Field(ge=1, le=1_000_000)
    task_name: Name


class BatchRef(BaseModel):
    """The part of a ``BatchMeta`` that ``get_data`` / ``put_fields`` need."""

    model_config = ConfigDict(extra="forbid")

    indexes: list[Index] = Field(max_length=1_000_000)
    fields: list[Name] = Field(max_length=_MAX_FIELDS)
    task_name: Name = "client"


class DataOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: dict[str, Tensor]


class PutFieldsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    indexes: list[Index] = Field(
        max_length=1_000_000, description="sample i of every field is written to indexes[i]"
    )
    data: dict[Name, Tensor] = Field(min_length=1, max_length=_MAX_FIELDS)


def _queue_bytes(state: ServerState, tenant: str) -> int:
    queue = state.gateway.queue
    total = 0
    for pid in state.gateway.partitions_of(tenant):
        if queue.has_partition(pid):
            total += queue.info(pid).nbytes
    return total


def _batch_meta(partition_id: str, ref: BatchRef) -> BatchMeta:
    # get_data/put use only the partition, indexes and fields; SampleMeta is the queue's.
    return BatchMeta.model_construct(
        partition_id=partition_id,
        task_name=ref.task_name,
        indexes=list(ref.indexes),
        fields=list(ref.fields),
        sample_meta=[],
    )


def _check_quota_bytes(state: ServerState, tenant: str, data: dict[str, Any]) -> None:
    incoming = sum(int(v.nbytes) for v in data.values())
    quotas = state.quotas_of(tenant)
    state.quotas.check_count(
        tenant,
        "queue_bytes",
        _queue_bytes(state, tenant),
        incoming,
        quotas.max_queue_bytes,
        "bytes in the Training Queue",
    )
    cap = state.config.queue_memory_cap_bytes
    held = state.gateway.queue.nbytes
    if cap is not None and held + incoming > cap:
        raise MemoryCapExceededError(
            f"the Training Queue holds {held} bytes of all tenants; {incoming} more would "
            f"exceed the server's memory cap of {cap} bytes (queue_memory_cap_bytes); "
            "consume and clear partitions, or retry later",
            cap_bytes=cap,
            used_bytes=held,
            requested_bytes=incoming,
        )


def _check_partition_count(state: ServerState, tenant: str) -> None:
    """A ``queue_put`` that creates a partition: refuse one beyond ``max_partitions``."""
    state.quotas.check_count(
        tenant,
        "partitions",
        len(state.gateway.partitions_of(tenant)),
        1,
        state.quotas_of(tenant).max_partitions,
        "Training Queue partitions",
    )


async def _body(request: Request, state: ServerState, model: type[Any]) -> Any:
    return await decode_body(
        request,
        model,
        max_body_bytes=state.config.max_body_bytes,
        max_tensor_bytes=state.config.max_tensor_bytes,
    )


@router.get("", response_model=list[PartitionInfo])
async def list_partitions(principal: TenantPrincipal, state: State) -> list[PartitionInfo]:
    """The calling tenant's partitions."""
    queue = state.gateway.queue
    pids = state.gateway.partitions_of(tenant_id_of(principal))
    return [queue.info(p) for p in pids if queue.has_partition(p)]


@router.get("/{partition_id}", response_model=PartitionInfo)
async def partition_info(
    partition_id: PathName, principal: TenantPrincipal, state: State
) -> PartitionInfo:
    """Sample count, fields, bytes and consumption of one partition."""
    return state.gateway.partition_info(tenant_id_of(principal), partition_id)


@router.post(
    "/{partition_id}/put",
    status_code=status.HTTP_201_CREATED,
    response_model=PutOut,
    openapi_extra=tensor_body(PutIn),
)
async def queue_put(
    partition_id: PathName, request: Request, principal: TenantPrincipal, state: State
) -> PutOut:
    """``queue_put``: append samples; the first put creates the partition and fixes its fields."""
    tenant = tenant_id_of(principal)
    state.gateway.partitions.check_put(partition_id, tenant)
    body: PutIn = await _body(request, state, PutIn)
    metas = body.metadata if isinstance(body.metadata, list) else [body.metadata]
    sample_meta = [
        SampleMeta(
            tenant_id=tenant,
            schema_signature=m.schema_signature,
            behavior_policy_version=m.behavior_policy_version,
        )
        for m in metas
    ]
    _check_quota_bytes(state, tenant, body.data)
    if not state.gateway.queue.has_partition(partition_id):
        _check_partition_count(state, tenant)
    state.gateway.partitions.claim(partition_id, tenant)
    indexes = await state.gateway.queue.async_queue_put(
        partition_id,
        body.data,
        sample_meta[0] if not isinstance(body.metadata, list) else sample_meta,
    )
    return PutOut(partition_id=partition_id, indexes=indexes)


@router.post("/{partition_id}/get_meta", response_model=BatchMeta)
async def get_meta(
    partition_id: PathName, body: GetMetaIn, principal: TenantPrincipal, state: State
) -> BatchMeta:
    """Choose the next ``batch_size`` samples ``task_name`` has not received (Appendix A.5)."""
    return await state.gateway.get_meta(
        tenant_id_of(principal), partition_id, body.fields, body.batch_size, body.task_name
    )


@router.post(
    "/{partition_id}/get_data",
    responses=tensor_response(DataOut),
)
async def get_data(
    partition_id: PathName,
    body: BatchRef,
    request: Request,
    principal: TenantPrincipal,
    state: State,
) -> Any:
    """The tensors of the samples a ``get_meta`` chose, rows in ``indexes`` order.

    Bounded before anything is read: at most ``max_get_data_indexes`` indexes and
    ``max_response_bytes`` bytes of answer per call, counted in the encoding the client
    asked for (a JSON answer carries base64, a third more than the tensors) — 422
    ``limit_exceeded``: page the read over several calls. A repeated index costs its
    bytes every time, so a small request cannot make the server build a huge answer.
    Over time, the answers' bytes are charged to the tenant's read budget
    (``read_bytes_per_s``, ``read_burst_bytes``): 429 ``read_bytes`` with
    ``retry_after_s`` past it, so one tenant cannot keep the server building answers."""
    tenant = tenant_id_of(principal)
    cfg = state.config
    if len(body.indexes) > cfg.max_get_data_indexes:
        raise LimitExceededError(
            f"get_data names {len(body.indexes)} indexes; this server returns at most "
            f"{cfg.max_get_data_indexes} per call (server setting max_get_data_indexes): "
            "split the indexes over several calls",
            field="indexes",
            limit=cfg.max_get_data_indexes,
            setting="max_get_data_indexes",
        )
    # Ownership first (in the gateway): another tenant's partition answers as unknown.
    size = state.gateway.read_nbytes(tenant, partition_id, body.fields, len(body.indexes))
    msgpack = wants_msgpack(request)
    answer = answer_nbytes(size, len(set(body.fields)), msgpack=msgpack)
    encoding = "msgpack" if msgpack else "JSON (base64)"
    if answer > cfg.max_response_bytes:
        raise LimitExceededError(
            f"get_data of {len(body.indexes)} samples of {sorted(set(body.fields))} is "
            f"{size} bytes of tensors, up to {answer} bytes as {encoding}; this server "
            f"returns at most {cfg.max_response_bytes} bytes per call (server setting "
            "max_response_bytes): split the indexes over several calls"
            + ("" if msgpack else ", or ask for msgpack (Accept: application/msgpack)"),
            field="indexes",
            limit_bytes=cfg.max_response_bytes,
            size_bytes=size,
            answer_bytes=answer,
            setting="max_response_bytes",
        )
    quotas = state.quotas_of(tenant)
    if answer > quotas.read_burst_bytes:
        raise LimitExceededError(
            f"get_data of {len(body.indexes)} samples is up to {answer} bytes as {encoding}, "
            f"more than tenant {tenant!r} may read at once (quota read_burst_bytes "
            f"{quotas.read_burst_bytes}): split the indexes over several calls",
            field="indexes",
            limit_bytes=quotas.read_burst_bytes,
            answer_bytes=answer,
            setting="read_burst_bytes",
        )
    state.quotas.take_read_bytes(tenant, answer, quotas)
    try:
        data = await state.gateway.get_data(tenant, _batch_meta(partition_id, body))
        arrays: dict[str, Any] = dict(data)  # torch tensors too: the codec converts them
        # Encoded off the event loop: other tenants' requests are served meanwhile.
        return await asyncio.to_thread(respond, request, DataOut.model_construct(data=arrays))
    except BaseException:
        state.quotas.refund_read_bytes(tenant, answer, quotas)  # nothing was answered
        raise


@router.post(
    "/{partition_id}/put_fields",
    status_code=status.HTTP_204_NO_CONTENT,
    openapi_extra=tensor_body(PutFieldsIn),
)
async def put_fields(
    partition_id: PathName, request: Request, principal: TenantPrincipal, state: State
) -> None:
    """``put``: write derived fields (advantages, returns, ...) for the samples of ``batch``."""
    tenant = tenant_id_of(principal)
    body: PutFieldsIn = await _body(request, state, PutFieldsIn)
    _check_quota_bytes(state, tenant, body.data)
    ref = BatchRef(indexes=body.indexes, fields=list(body.data))
    await state.gateway.put_fields(tenant, body.data, _batch_meta(partition_id, ref))


@router.delete("/{partition_id}", status_code=status.HTTP_204_NO_CONTENT)
async def clear(partition_id: PathName, principal: TenantPrincipal, state: State) -> None:
    """``queue_clear``: release a consumed partition (a no-op for an unknown one, and so
    for another tenant's, which the caller cannot tell from an unknown one)."""
    await state.gateway.clear(tenant_id_of(principal), partition_id)
