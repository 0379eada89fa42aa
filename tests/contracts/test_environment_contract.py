"""The Environment Service contract, run against the real service (reach2d simulator
workers) and the fake: session lifecycle, observation shapes, the error classes, and
ownership — another tenant's session answers exactly as an unknown one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from joynexus.envs.base import EnvObservation, EnvSpec
from joynexus.errors import (
    CapacityError,
    InvalidRequestError,
    JoyNexusError,
    NotFoundError,
    SchemaMismatchError,
    SpecError,
)
from joynexus.services.environment import EnvironmentService, EnvironmentServiceConfig
from joynexus.services.protocols import EnvironmentServiceAPI
from tests.contracts.conftest import ENV_SPEC, SCHEMA
from tests.fakes.environment import FakeEnvironmentService

A, B = "alice", "bob"
N = ENV_SPEC.num_envs


def make(kind: str) -> EnvironmentServiceAPI:
    if kind == "real":
        return EnvironmentService(EnvironmentServiceConfig(max_sessions_per_tenant=1))
    return FakeEnvironmentService(max_sessions_per_tenant=1)


def with_service(kind: str, body: Callable[[EnvironmentServiceAPI], Awaitable[None]]) -> None:
    async def main() -> None:
        env = make(kind)
        try:
            await body(env)
        finally:
            await env.aclose()

    asyncio.run(main())


def check_observation(obs: EnvObservation) -> None:
    assert set(obs.cameras) == set(SCHEMA.cameras)
    for name, cam in SCHEMA.cameras.items():
        frame = obs.cameras[name]
        assert frame.shape == (N, *cam.shape) and frame.dtype == np.uint8, name
    assert obs.state.shape == (N, SCHEMA.state_dim) and obs.state.dtype == np.float32
    assert obs.num_envs == N and isinstance(obs.instruction, str)


async def answer(call: Awaitable[Any]) -> tuple[str, str, dict[str, Any]]:
    """The error a call raises: class, message, details."""
    try:
        await call
    except JoyNexusError as error:
        return type(error).__name__, error.message, error.details
    raise AssertionError("no error")


def test_a_session_is_created_stepped_and_closed(kind: str) -> None:
    async def body(env: EnvironmentServiceAPI) -> None:
        info = await env.create_session(A, ENV_SPEC)
        assert (info.tenant_id, info.num_envs, info.kind) == (A, N, "reach2d")
        assert info.schema == SCHEMA
        assert [s.session_id for s in await env.list_sessions(A)] == [info.session_id]
        assert await env.list_sessions(B) == []
        sid = info.session_id
        check_observation(await env.reset(sid, "r-1", seed=5, tenant_id=A))
        ended = np.zeros(N, bool)
        for _ in range(ENV_SPEC.max_episode_steps or 1):
            step = await env.step(sid, np.zeros((N, SCHEMA.action_dim)), tenant_id=A)
            check_observation(step.observation)
            for name in ("reward", "terminated", "truncated", "success"):
                assert np.asarray(getattr(step, name)).shape == (N,), name
            assert step.terminated.dtype == step.truncated.dtype == np.bool_
            assert step.info["rollout_id"] == "r-1"
            ended |= step.terminated | step.truncated
        assert ended.all(), "max_episode_steps ends every sub-env's episode"
        assert not env.is_crashed(sid)
        await env.close(sid, tenant_id=A)
        assert await env.list_sessions(A) == []
        assert not env.is_crashed(sid)
        with pytest.raises(NotFoundError, match=sid):
            await env.step(sid, np.zeros((N, SCHEMA.action_dim)), tenant_id=A)

    with_service(kind, body)


def test_another_tenants_session_answers_exactly_as_an_unknown_one(kind: str) -> None:
    async def body(env: EnvironmentServiceAPI) -> None:
        sid = (await env.create_session(A, ENV_SPEC)).session_id
        await env.reset(sid, "r", seed=0, tenant_id=A)
        zeros = np.zeros((N, SCHEMA.action_dim))
        calls: list[Callable[[str, str], Awaitable[Any]]] = [
            lambda s, t: env.reset(s, "r", seed=0, tenant_id=t),
            lambda s, t: env.step(s, zeros, tenant_id=t),
            lambda s, t: env.close(s, tenant_id=t),
        ]
        for call in calls:
            foreign = await answer(call(sid, B))
            unknown = await answer(call("env-never-issued", B))
            assert foreign[0] == unknown[0] == "NotFoundError"
            assert foreign[1] == unknown[1].replace("env-never-issued", sid)
            assert foreign[2] == {"session_id": sid}
        await env.step(sid, zeros, tenant_id=A)  # the owner's session is untouched

    with_service(kind, body)


def test_misuse_raises_the_documented_errors(kind: str) -> None:
    async def body(env: EnvironmentServiceAPI) -> None:
        with pytest.raises(SpecError):
            await env.create_session(A, EnvSpec(kind="no-such-simulator"))
        sid = (await env.create_session(A, ENV_SPEC)).session_id
        with pytest.raises(CapacityError, match="max_sessions_per_tenant"):
            await env.create_session(A, ENV_SPEC)
        with pytest.raises(InvalidRequestError, match="group_size"):
            await env.reset(sid, "r", seed=0, tenant_id=A, group_size=3)
        with pytest.raises(InvalidRequestError, match="seed"):
            await env.reset(sid, "r", tenant_id=A, group_size=2)
        await env.reset(sid, "r", seed=0, tenant_id=A)
        with pytest.raises(SchemaMismatchError, match="actions"):
            await env.step(sid, np.zeros((N, SCHEMA.action_dim + 1)), tenant_id=A)
        await env.aclose()
        assert await env.list_sessions(A) == []
        assert (await env.create_session(A, ENV_SPEC)).tenant_id == A  # capacity is back

    with_service(kind, body)
