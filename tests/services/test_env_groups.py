"""Environment Service: grouped resets through the simulator worker."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from joynexus.envs import EnvSpec, register_env, unregister_env
from joynexus.envs.base import EnvAdapter, EnvObservation, EnvStep
from joynexus.errors import InvalidRequestError, SpecError
from joynexus.services.environment import EnvironmentService
from tests.envs.fake_envs import make_fake


class _NoGroups(EnvAdapter):
    """An adapter written before groups: its reset takes a seed only."""

    def __init__(self, spec: EnvSpec) -> None:
        self.inner = make_fake(spec)
        self.schema, self.num_envs = self.inner.schema, self.inner.num_envs

    def reset(self, seed: int | None = None) -> EnvObservation:  # type: ignore[override]
        return self.inner.reset(seed)

    def step(self, actions: np.ndarray) -> EnvStep:
        return self.inner.step(actions)

    def close(self) -> None:
        self.inner.close()


def make_no_groups(spec: EnvSpec) -> EnvAdapter:
    return _NoGroups(spec)


def test_grouped_resets_through_the_worker() -> None:
    async def main() -> None:
        svc = EnvironmentService()
        try:
            info = await svc.create_session("a", EnvSpec(kind="fake", num_envs=6))
            sid = info.session_id
            obs = await svc.reset(sid, "r1", 100, tenant_id="a", group_size=3)
            assert obs.state[:, 1].tolist() == [100, 100, 100, 101, 101, 101]
            obs = await svc.reset(sid, "r2", 100, tenant_id="a")
            assert obs.state[:, 1].tolist() == [100, 101, 102, 103, 104, 105]
            with pytest.raises(
                InvalidRequestError, match=r"group_size=4 does not divide num_envs=6"
            ):
                await svc.reset(sid, "r3", 100, tenant_id="a", group_size=4)
            with pytest.raises(InvalidRequestError, match="needs a seed"):
                await svc.reset(sid, "r4", None, tenant_id="a", group_size=2)
        finally:
            await svc.aclose()

    asyncio.run(main())


def test_a_kind_without_groups_refuses_a_grouped_reset_clearly() -> None:
    register_env(
        "nogroups",
        "tests.services.test_env_groups:make_no_groups",
        schema="tests.envs.fake_envs:fake_schema",
        description="test env without grouped resets",
        replace=True,
    )

    async def main() -> None:
        svc = EnvironmentService()
        try:
            info = await svc.create_session("a", EnvSpec(kind="nogroups", num_envs=2))
            obs = await svc.reset(info.session_id, "r1", 5, tenant_id="a")  # ungrouped: fine
            assert obs.state[:, 1].tolist() == [5, 6]
            with pytest.raises(SpecError, match="'nogroups' cannot start a group of sub-envs"):
                await svc.reset(info.session_id, "r2", 5, tenant_id="a", group_size=2)
        finally:
            await svc.aclose()

    try:
        asyncio.run(main())
    finally:
        unregister_env("nogroups")
