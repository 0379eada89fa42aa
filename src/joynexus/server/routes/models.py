"""Model primitives of paper Figure 4 on the caller's own tenant slot.

``/v1/models/{tenant_id}/...`` — the path names the slot and must be the caller:

* Inference Model Service: ``predict`` (actions, log-probs, values), ``load_weights``
  (publish named tensors as a serving version), ``rollout`` (future);
* Training Model Service: ``train_batch`` (one optimizer step on a caller-built batch),
  ``train_job`` (future; a job the tenant reserved and leased), ``export_params``,
  ``save`` (future);
* ``export``: the tenant's action module as named tensors plus a manifest.

Tensor bodies are msgpack (``application/msgpack``) or JSON tensors. The slot exists
once the tenant submitted a workload (task ``custom`` gives a slot and nothing else).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Request, status
from pydantic import BaseModel, ConfigDict, Field

from joynexus.errors import LimitExceededError, SchemaMismatchError
from joynexus.metrics.stages import StageMeter
from joynexus.models.batch import ObservationBatch
from joynexus.server.config import ServerConfig
from joynexus.server.disk_quota import check_disk_quota
from joynexus.server.futures import FutureRef
from joynexus.server.names import Name, PathName
from joynexus.server.routes.metrics import METRICS
from joynexus.server.state import ServerState, State, TenantPrincipal, tenant_id_of
from joynexus.server.wire import (
    Tensor,
    decode_body,
    decode_bytes,
    read_body,
    respond,
    tensor_body,
    tensor_response,
)
from joynexus.wire import check_tensor

router = APIRouter(prefix="/v1/models/{tenant_id}", tags=["models"])

_MAX_TENSORS = 1024
Version = Annotated[int, Field(ge=0, le=2**62)]
Instruction = Annotated[str, Field(max_length=4096)]


class ObservationsIn(BaseModel):
    """A batch of B observations in the tenant's schema."""

    model_config = ConfigDict(extra="forbid")

    cameras: dict[Name, Tensor] = Field(max_length=16, description="uint8 [B, H, W, C]")
    state: Tensor = Field(description="float32 [B, state_dim]")
    instructions: list[Instruction] = Field(min_length=1, max_length=65_536)
    actions: Tensor | None = Field(default=None, description="float32 [B, chunk, action_dim]")

    def check_finite(self) -> None:
        """Refuse state or actions that hold NaN or inf (422).

        Raises:
            SchemaMismatchError: the first such field.
        """
        for name, arr in (("state", self.state), ("actions", self.actions)):
            if arr is not None and arr.dtype.kind == "f" and not bool(np.isfinite(arr).all()):
                raise SchemaMismatchError(
                    f"observations.{name}: contains NaN or infinite values; expected "
                    "finite float32",
                    field=f"observations.{name}",
                )

    def batch(self) -> ObservationBatch:
        """The batch, refused here when its state or actions hold NaN or inf (422)."""
        self.check_finite()
        return ObservationBatch(
            cameras=dict(self.cameras),
            state=np.asarray(self.state),
            instructions=list(self.instructions),
            actions=None if self.actions is None else np.asarray(self.actions),
        )


class PredictIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    observations: ObservationsIn
    policy_version: Version | None = None
    mode: Literal["mean", "sample"] = "mean"


class PredictOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    actions: Tensor
    log_probs: Tensor | None = None
    values: Tensor | None = None
    policy_version: int
    flow_chain: Tensor | None = Field(
        default=None,
        description="float32 [B, steps + 1, chunk, A]: a flow_matching head's Flow-SDE chain "
        "in sample mode (send it back to train_batch for ppo / grpo / reinforce)",
    )


class TrainBatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    observations: ObservationsIn = Field(description="with actions")
    loss: Literal["sft", "ppo", "grpo", "reinforce"] = "sft"
    advantages: Tensor | None = Field(
        default=None, description="float32 [B], finite (ppo, grpo, reinforce)"
    )
    old_log_probs: Tensor | None = Field(
        default=None, description="float32 [B] behaviour log-probs, finite (ppo, grpo)"
    )
    returns: Tensor | None = Field(
        default=None, description="float32 [B] value targets, finite (ppo with a critic)"
    )
    action_is_pad: Tensor | None = Field(
        default=None, description="bool [B, chunk]: padded action-chunk steps (sft)"
    )
    flow_chain: Tensor | None = Field(
        default=None,
        description="float32 [B, steps + 1, chunk, A]: the Flow-SDE chains predict returned "
        "(rl on a flow_matching head)",
    )


class StepOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    loss: float
    policy_version: int
    grad_norm: float


class ParamsOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str
    policy_version: int
    schema_signature: str
    named_tensors: dict[str, Tensor]


class LoadWeightsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Version
    named_tensors: dict[Annotated[str, Field(max_length=256)], Tensor] = Field(
        min_length=1, max_length=_MAX_TENSORS
    )


class LoadWeightsOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy_version: int


class SaveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_optim: bool = True


class RolloutIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: Name = Field(description="a job the tenant reserved (state reserved)")
    session_id: Name
    num_envs: int = Field(ge=1, le=1024)
    horizon: int = Field(ge=1, le=100_000)
    version: Version | None = None
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None


class TrainJobIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: Name = Field(description="a job the tenant leased (state leased)")


class ExportOut(BaseModel):
    """The tenant's action module: manifest plus named tensors (never the base model)."""

    model_config = ConfigDict(extra="forbid")

    manifest: dict[str, Any]
    named_tensors: dict[str, Tensor]


def own_slot(tenant_id: PathName, principal: TenantPrincipal, state: State) -> str:
    # A dependency, so a foreign slot answers 403 before the body is even validated;
    # the one tenant check of the predict path.
    return state.gateway.own_slot(tenant_id, tenant_id_of(principal))


#: The calling tenant, which must be the ``{tenant_id}`` of the path.
OwnSlot = Annotated[str, Depends(own_slot)]


async def _body(request: Request, state: ServerState, model: type[Any]) -> Any:
    return await decode_body(
        request,
        model,
        max_body_bytes=state.config.max_body_bytes,
        max_tensor_bytes=state.config.max_tensor_bytes,
    )


def _f32(value: Any) -> Any:
    return None if value is None else np.asarray(value, dtype=np.float32)


@router.post(
    "/predict", openapi_extra=tensor_body(PredictIn), responses=tensor_response(PredictOut)
)
async def predict(tenant: OwnSlot, request: Request, state: State) -> Any:
    """``predict``: actions (and log-probs in ``sample`` mode, values with a critic)."""
    started = time.perf_counter()
    raw = await read_body(request, state.config.max_body_bytes)
    read = time.perf_counter()
    body = decode_bytes(
        raw,
        request.headers.get("content-type"),
        PredictIn,
        max_tensor_bytes=state.config.max_tensor_bytes,
    )
    check_predict_size(state.config, body.observations)
    observations = body.observations.batch()
    decoded = time.perf_counter()
    result = await state.gateway.primitives.predict(
        tenant, observations, body.policy_version, body.mode
    )
    answered = time.perf_counter()
    out = PredictOut.model_construct(
        actions=np.asarray(result.actions, dtype=np.float32),
        log_probs=_f32(result.log_probs),
        values=_f32(result.values),
        policy_version=int(result.policy_version),
        flow_chain=_f32(result.chain),
    )
    response = respond(request, out)
    stages = stage_meter(state)
    if stages is not None:
        stages.add("http_read", read - started)
        stages.add("http_decode", decoded - read)
        stages.add("http_encode", time.perf_counter() - answered)
    return response


def check_predict_size(cfg: ServerConfig, obs: ObservationsIn) -> None:
    """Bound the rows and text one predict puts on the shared backbone (422)."""
    rows = len(obs.instructions)
    if rows > cfg.max_predict_rows:
        raise LimitExceededError(
            f"predict carries {rows} observations; this server takes at most "
            f"{cfg.max_predict_rows} per call (server setting max_predict_rows): split "
            "the batch over several calls",
            field="observations.instructions",
            limit=cfg.max_predict_rows,
            setting="max_predict_rows",
        )
    chars = sum(len(t) for t in obs.instructions)
    if chars > cfg.max_predict_text_chars:
        raise LimitExceededError(
            f"predict carries {chars} characters of instructions; this server takes at "
            f"most {cfg.max_predict_text_chars} per call (server setting "
            "max_predict_text_chars): send fewer rows or shorter instructions",
            field="observations.instructions",
            limit=cfg.max_predict_text_chars,
            setting="max_predict_text_chars",
        )


def stage_meter(state: ServerState) -> StageMeter | None:
    """The Metrics Service's predict-stage meter, when this server has one."""
    metrics = state.services.extras.get(METRICS)
    stages = getattr(metrics, "stages", None)
    return stages if isinstance(stages, StageMeter) else None


@router.post("/train_batch", response_model=StepOut, openapi_extra=tensor_body(TrainBatchIn))
async def train_batch(tenant: OwnSlot, request: Request, state: State) -> StepOut:
    """``train_batch``: one optimizer step of the tenant's slot on a caller-built batch.

    Every field is checked against the batch first (B = number of instructions: leading
    dimension B everywhere, ``[B]`` for advantages / log-probs / returns, ``[B, chunk]``
    for ``action_is_pad``); a mismatch answers 422 naming the field and the expected
    shape, and the optimizer is not stepped."""
    from joynexus.services.training import TrainBatch

    body: TrainBatchIn = await _body(request, state, TrainBatchIn)
    batch = TrainBatch(
        observations=body.observations.batch(),
        loss=body.loss,
        advantages=_f32(body.advantages),
        old_log_probs=_f32(body.old_log_probs),
        returns=_f32(body.returns),
        action_is_pad=None if body.action_is_pad is None else np.asarray(body.action_is_pad),
        flow_chain=_f32(body.flow_chain),
    )
    # Checked once, by the Training Model Service before it steps (TrainBatch.check),
    # for this route and every in-process or Ray caller alike.
    step = await state.gateway.primitives.train_batch(tenant, batch)
    return StepOut(
        loss=float(step.loss), policy_version=int(step.policy_version), grad_norm=step.grad_norm
    )


@router.post("/export_params", responses=tensor_response(ParamsOut))
async def export_params(tenant: OwnSlot, request: Request, state: State) -> Any:
    """``export_params``: the tenant's current action-module tensors (no shared base)."""
    version, signature, named = await state.gateway.primitives.export_params(tenant)
    out = ParamsOut.model_construct(
        tenant_id=tenant, policy_version=version, schema_signature=signature, named_tensors=named
    )
    return respond(request, out)


@router.post(
    "/load_weights", response_model=LoadWeightsOut, openapi_extra=tensor_body(LoadWeightsIn)
)
async def load_weights(tenant: OwnSlot, request: Request, state: State) -> LoadWeightsOut:
    """``load_weights``: publish named tensors as the tenant's serving ``version``.

    A tensor holding NaN or inf is refused (400, naming it): served, it would answer
    NaN actions."""
    body: LoadWeightsIn = await _body(request, state, LoadWeightsIn)
    for name, arr in body.named_tensors.items():
        check_tensor(arr, name=f"named_tensors[{name!r}]", finite=True)
    served = await state.gateway.primitives.load_weights(tenant, body.version, body.named_tensors)
    return LoadWeightsOut(policy_version=served)


def _submit(state: ServerState, tenant: str, kind: str, work: Any) -> FutureRef:
    quotas = state.quotas_of(tenant)
    return state.gateway.futures.submit(tenant, kind, work, max_pending=quotas.max_pending_futures)


@router.post("/save", status_code=status.HTTP_202_ACCEPTED, response_model=FutureRef)
async def save(tenant: OwnSlot, body: SaveIn, state: State) -> FutureRef:
    """``save``: checkpoint the slot; the future's result lists the written paths."""
    slots = state.gateway.primitives
    slots.require_slot(tenant)
    await check_disk_quota(state, tenant)  # past its disk quota: 429 disk_bytes

    async def work() -> dict[str, Any]:
        return {"paths": await slots.save(tenant, include_optim=body.include_optim)}

    return _submit(state, tenant, "models.save", work)


@router.post("/rollout", status_code=status.HTTP_202_ACCEPTED, response_model=FutureRef)
async def rollout(tenant: OwnSlot, body: RolloutIn, state: State) -> FutureRef:
    """``rollout``: an env loop over ``predict`` into a reserved job's partition (future)."""
    slots = state.gateway.primitives
    slots.require_slot(tenant)

    async def work() -> dict[str, Any]:
        # Another tenant's job fails the future exactly as an unknown one (no oracle).
        return await slots.rollout(
            tenant,
            body.job_id,
            body.session_id,
            num_envs=body.num_envs,
            horizon=body.horizon,
            version=body.version,
            seed=body.seed,
        )

    return _submit(state, tenant, "models.rollout", work)


@router.post("/train_job", status_code=status.HTTP_202_ACCEPTED, response_model=FutureRef)
async def train_job(tenant: OwnSlot, body: TrainJobIn, state: State) -> FutureRef:
    """``train_job``: train a leased job of the tenant from its partition (future)."""
    slots = state.gateway.primitives
    slots.require_slot(tenant)

    async def work() -> dict[str, Any]:
        return await slots.train_job(tenant, body.job_id)

    return _submit(state, tenant, "models.train_job", work)


@router.get("/export", responses=tensor_response(ExportOut))
async def export(tenant: OwnSlot, request: Request, state: State) -> Any:
    """The tenant's action module with a manifest (schema, head, version, base model id)."""
    manifest, named = await state.gateway.primitives.export(tenant)
    return respond(request, ExportOut.model_construct(manifest=manifest, named_tensors=named))
