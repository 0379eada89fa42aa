"""Environment sessions over the Environment Service (paper Figure 4: reset / step / close).

Creating a session starts a simulator worker process, which can take seconds to
minutes, so it answers a future whose result is the session. ``reset`` and ``step``
carry observations and actions: msgpack (``Accept: application/msgpack``) or JSON
tensors. A session belongs to the tenant that created it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request, status
from pydantic import BaseModel, ConfigDict, Field

from joynexus.envs.base import EnvObservation, EnvSpec, EnvStep
from joynexus.models.schema import DataSchema
from joynexus.server.envpolicy import check_session_spec
from joynexus.server.futures import FutureRef
from joynexus.server.names import Name, PathName
from joynexus.server.state import State, TenantPrincipal, tenant_id_of
from joynexus.server.wire import Tensor, decode_body, respond, tensor_body, tensor_response
from joynexus.services.environment import SessionInfo
from joynexus.wire import check_tensor

router = APIRouter(prefix="/v1/env/sessions", tags=["environment"])


class SessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: EnvSpec


class SessionOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    kind: str
    task: str | None
    num_envs: int
    data_schema: DataSchema = Field(alias="schema")


class ResetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rollout_id: Name
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None


class StepIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    actions: Tensor = Field(description="float32 [num_envs, action_dim], finite")


class ObservationOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cameras: dict[str, Tensor]
    state: Tensor
    instruction: str


class StepOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    observation: ObservationOut
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    success: Tensor
    final_observation: ObservationOut | None = None
    rollout_id: str | None = None


def _session(info: SessionInfo) -> SessionOut:
    return SessionOut.model_validate(
        {
            "session_id": info.session_id,
            "kind": info.kind,
            "task": info.task,
            "num_envs": info.num_envs,
            "schema": info.schema,
        }
    )


def _obs(obs: EnvObservation) -> ObservationOut:
    return ObservationOut.model_construct(
        cameras=dict(obs.cameras), state=obs.state, instruction=obs.instruction
    )


def _step(step: EnvStep) -> StepOut:
    final = step.info.get("final_observation")
    rollout = step.info.get("rollout_id")
    return StepOut.model_construct(
        observation=_obs(step.observation),
        reward=step.reward,
        terminated=step.terminated,
        truncated=step.truncated,
        success=step.success,
        final_observation=_obs(final) if isinstance(final, EnvObservation) else None,
        rollout_id=rollout if isinstance(rollout, str) else None,
    )


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=FutureRef)
async def create_session(
    body: SessionCreate, principal: TenantPrincipal, state: State
) -> FutureRef:
    """Start a simulator session; the future's result is the session (``SessionOut``).

    The spec obeys the server's environment limits, the same as a workload's ``env``
    (``num_envs``, ``image_size``: 422; a denied kind: 403), and a ``kind: gym`` spec
    may name only the ids, ``imports`` and ``make_kwargs`` keys the admin allowed
    (``ServerConfig.gym_allowed_*``; 403 otherwise).
    """
    tenant = tenant_id_of(principal)
    check_session_spec(state, body.spec)
    quotas = state.quotas_of(tenant)
    env = state.gateway.env
    held = len(await env.list_sessions(tenant)) + state.pending_sessions.get(tenant, 0)
    state.quotas.check_count(
        tenant, "sessions", held, 1, quotas.max_sessions, "environment sessions"
    )
    state.pending_sessions[tenant] = state.pending_sessions.get(tenant, 0) + 1

    async def work() -> dict[str, Any]:
        try:
            info = await env.create_session(tenant, body.spec)
        finally:
            state.pending_sessions[tenant] -= 1
        return _session(info).model_dump(mode="json", by_alias=True)

    try:
        return state.gateway.futures.submit(
            tenant, "env.create_session", work, max_pending=quotas.max_pending_futures
        )
    except BaseException:
        state.pending_sessions[tenant] -= 1
        raise


@router.get("", response_model=list[SessionOut])
async def list_sessions(principal: TenantPrincipal, state: State) -> list[SessionOut]:
    """The calling tenant's open sessions."""
    sessions = await state.gateway.env.list_sessions(tenant_id_of(principal))
    return [_session(s) for s in sessions]


@router.post("/{session_id}/reset", responses=tensor_response(ObservationOut))
async def reset(
    session_id: PathName, body: ResetIn, request: Request, principal: TenantPrincipal, state: State
) -> Any:
    """Start rollout ``rollout_id`` in every sub-env; answers the first observation."""
    obs = await state.gateway.env.reset(
        session_id, body.rollout_id, body.seed, tenant_id=tenant_id_of(principal)
    )
    return respond(request, _obs(obs))


@router.post(
    "/{session_id}/step",
    openapi_extra=tensor_body(StepIn),
    responses=tensor_response(StepOut),
)
async def step(
    session_id: PathName, request: Request, principal: TenantPrincipal, state: State
) -> Any:
    """Apply one batch of actions; finished episodes auto-reset (see ``final_observation``)."""
    body = await decode_body(
        request,
        StepIn,
        max_body_bytes=state.config.max_body_bytes,
        max_tensor_bytes=state.config.max_tensor_bytes,
    )
    actions = check_tensor(
        body.actions, name="actions", dtypes=("float32", "float64"), shape=(None, None), finite=True
    )
    result = await state.gateway.env.step(
        session_id, actions.astype("float32"), tenant_id=tenant_id_of(principal)
    )
    return respond(request, _step(result))


@router.delete("/{session_id}", status_code=status.HTTP_204_NO_CONTENT)
async def close(session_id: PathName, principal: TenantPrincipal, state: State) -> None:
    """Close the session and stop its simulator."""
    await state.gateway.env.close(session_id, tenant_id=tenant_id_of(principal))
