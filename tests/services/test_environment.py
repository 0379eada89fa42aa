"""Environment Service: ownership, limits, reaping, worker isolation, timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from joynexus.envs import EnvSpec, register_env, unregister_env
from joynexus.errors import (
    CapacityError,
    NotFoundError,
    SchemaMismatchError,
    SimulatorCrashedError,
    SpecError,
)
from joynexus.services.environment import EnvironmentService, EnvironmentServiceConfig
from joynexus.utils.clock import FakeClock
from tests.envs.fake_envs import fake_schema

FAKE = EnvSpec(kind="fake", num_envs=2, image_size=4)


def run(fn: Callable[[EnvironmentService], Awaitable[None]], **config: Any) -> FakeClock:
    clock = FakeClock()
    service = EnvironmentService(EnvironmentServiceConfig(**config), clock=clock)

    async def main() -> None:
        try:
            await fn(service)
        finally:
            await service.aclose()

    asyncio.run(main())
    return clock


def test_session_lifecycle_and_observations_in_schema() -> None:
    async def body(svc: EnvironmentService) -> None:
        info = await svc.create_session("alice", FAKE)
        assert info.tenant_id == "alice" and info.num_envs == 2
        assert info.schema == fake_schema(FAKE)
        obs = await svc.reset(info.session_id, "rollout-1", seed=10, tenant_id="alice")
        assert obs.cameras["cam"].shape == (2, 4, 4, 3) and obs.cameras["cam"].dtype == np.uint8
        assert obs.state.dtype == np.float32
        assert obs.state[:, 1].tolist() == [10.0, 11.0]  # sub-env i is seeded with seed + i
        assert obs.instruction == "do the fake thing"
        step = await svc.step(info.session_id, np.array([[1, 0], [-1, 0]]), tenant_id="alice")
        assert step.reward.tolist() == [1.0, -1.0]
        assert step.terminated.dtype == bool and step.success.shape == (2,)
        assert step.info["rollout_id"] == "rollout-1"
        assert step.observation.state[:, 0].tolist() == [1.0, 1.0]
        with pytest.raises(SchemaMismatchError, match="action_dim=2"):
            await svc.step(info.session_id, np.zeros((2, 3)), tenant_id="alice")
        assert [s.session_id for s in await svc.list_sessions("alice")] == [info.session_id]
        await svc.close(info.session_id, tenant_id="alice")
        assert await svc.list_sessions("alice") == []
        with pytest.raises(NotFoundError):
            await svc.step(info.session_id, np.zeros((2, 2)), tenant_id="alice")

    run(body)


def test_other_tenants_are_refused_and_limits_hold() -> None:
    async def body(svc: EnvironmentService) -> None:
        a1, a2 = await asyncio.gather(
            svc.create_session("alice", FAKE), svc.create_session("alice", FAKE)
        )
        with pytest.raises(CapacityError, match="max_sessions_per_tenant"):
            await svc.create_session("alice", FAKE)
        bob = await svc.create_session("bob", FAKE)  # limits are per tenant
        for call in (
            svc.reset(a1.session_id, "r", tenant_id="bob"),
            svc.step(a1.session_id, np.zeros((2, 2)), tenant_id="bob"),
            svc.close(a1.session_id, tenant_id="bob"),
        ):
            # Another tenant's session answers exactly as an unknown one (no oracle).
            with pytest.raises(NotFoundError, match="no environment session"):
                await call
        assert {s.session_id for s in await svc.list_sessions("bob")} == {bob.session_id}
        # alice's sessions are untouched by bob's refused calls
        one, two = await asyncio.gather(
            svc.step(a1.session_id, np.ones((2, 2)), tenant_id="alice"),
            svc.step(a2.session_id, -np.ones((2, 2)), tenant_id="alice"),
        )
        assert one.reward.tolist() == [1.0, 1.0]
        assert two.reward.tolist() == [-1.0, -1.0]
        await svc.close(a1.session_id, tenant_id="alice")
        await svc.create_session("alice", FAKE)  # a freed slot can be reused
        with pytest.raises(SpecError, match="known kinds"):
            await svc.create_session("alice", EnvSpec(kind="no-such-sim"))

    run(body, max_sessions_per_tenant=2)


def test_idle_sessions_are_reaped_with_fake_clock() -> None:
    async def body(svc: EnvironmentService) -> None:
        clock = svc.clock
        assert isinstance(clock, FakeClock)
        idle = await svc.create_session("alice", FAKE)
        busy = await svc.create_session("alice", FAKE)
        clock.advance(60)
        await svc.step(busy.session_id, np.zeros((2, 2)), tenant_id="alice")
        clock.advance(50)
        assert await svc.reap_idle() == [idle.session_id]
        with pytest.raises(NotFoundError, match="reaped"):
            await svc.reset(idle.session_id, "r", tenant_id="alice")
        reaper = asyncio.create_task(svc.run_reaper(interval_s=10))
        await asyncio.sleep(0)
        clock.advance(100)  # the reaper wakes, and `busy` has now been idle > 100 s
        for _ in range(200):
            if not await svc.list_sessions("alice"):
                break
            await asyncio.sleep(0.01)
        reaper.cancel()
        assert await svc.list_sessions("alice") == []

    run(body, idle_timeout_s=100)


def test_crashed_and_hung_simulators_fail_only_their_own_sessions() -> None:
    async def body(svc: EnvironmentService) -> None:
        crashy, hangy, healthy = await asyncio.gather(
            svc.create_session("alice", EnvSpec(kind="fake", options={"crash_at": 2})),
            svc.create_session("alice", EnvSpec(kind="fake", options={"hang_at": 1})),
            svc.create_session("bob", EnvSpec(kind="fake")),
        )
        one = np.zeros((1, 2))
        await svc.step(crashy.session_id, one, tenant_id="alice")
        crashed, hung = await asyncio.gather(
            svc.step(crashy.session_id, one, tenant_id="alice"),
            svc.step(hangy.session_id, one, tenant_id="alice"),
            return_exceptions=True,
        )
        assert isinstance(crashed, SimulatorCrashedError)
        assert "died" in crashed.message and "exit code 3" in crashed.message
        assert isinstance(hung, SimulatorCrashedError) and "timeout" in hung.message
        assert svc.is_crashed(crashy.session_id) and svc.is_crashed(hangy.session_id)
        with pytest.raises(SimulatorCrashedError):  # stays failed until closed
            await svc.reset(crashy.session_id, "r2", tenant_id="alice")
        # everyone else keeps being served
        for _ in range(3):
            step = await svc.step(healthy.session_id, one, tenant_id="bob")
        assert step.observation.state[0, 0] == 3.0
        await svc.close(crashy.session_id, tenant_id="alice")
        await svc.close(hangy.session_id, tenant_id="alice")
        assert await svc.list_sessions("alice") == []

    run(body, step_timeout_s=1.5)


def _local_factory(spec: EnvSpec) -> Any:  # pragma: no cover - never reaches a worker
    raise AssertionError


def test_factory_errors_surface_with_their_class() -> None:
    register_env("unpicklable", lambda s: _local_factory(s), schema=fake_schema, description="x")
    try:

        async def body(svc: EnvironmentService) -> None:
            with pytest.raises(SpecError, match="module-level function"):
                await svc.create_session("alice", EnvSpec(kind="unpicklable"))
            # A spec error raised inside the worker comes back as a SpecError.
            with pytest.raises(SpecError, match="pusht takes no options"):
                await svc.create_session("alice", EnvSpec(kind="pusht", options={"x": 1}))
            assert await svc.list_sessions("alice") == []

        run(body)
    finally:
        unregister_env("unpicklable")
