"""Real simulators behind the Environment Service: PushT, MetaWorld and a remote env."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from joynexus.envs import EnvSpec
from joynexus.envs.env_server import BackgroundEnvServer
from joynexus.services.environment import EnvironmentService

pytest.importorskip("gym_pusht")
pytest.importorskip("metaworld")


def test_pusht_metaworld_and_remote_sessions_side_by_side() -> None:
    with BackgroundEnvServer(EnvSpec(kind="pusht", image_size=24)) as url:

        async def main() -> None:
            svc = EnvironmentService()
            try:
                pusht, mw, remote = await asyncio.gather(
                    svc.create_session("alice", EnvSpec(kind="pusht", num_envs=2, image_size=16)),
                    svc.create_session(
                        "bob", EnvSpec(kind="metaworld", task="reach-v3", image_size=16)
                    ),
                    svc.create_session(
                        "carol",
                        EnvSpec(kind="remote", image_size=16, options={"url": url}),
                    ),
                )
                cases = [
                    ("alice", pusht, np.full((2, 2), 256.0), "top", 2),
                    ("bob", mw, np.zeros((1, 4)), "corner", 39),
                    ("carol", remote, np.full((1, 2), 256.0), "top", 2),
                ]
                for tenant, info, actions, camera, state_dim in cases:
                    obs = await svc.reset(info.session_id, "r0", seed=0, tenant_id=tenant)
                    n = info.num_envs
                    assert obs.cameras[camera].shape == (n, 16, 16, 3)
                    assert obs.cameras[camera].std() > 1  # a rendered image
                    assert obs.state.shape == (n, state_dim)
                    step = await svc.step(info.session_id, actions, tenant_id=tenant)
                    assert step.reward.shape == step.success.shape == (n,)
                    assert step.info["rollout_id"] == "r0"
                # The remote PushT and a local one with the same seed agree on the state.
                local = await svc.create_session("carol", EnvSpec(kind="pusht", image_size=16))
                a = await svc.reset(local.session_id, "r1", seed=7, tenant_id="carol")
                b = await svc.reset(remote.session_id, "r1", seed=7, tenant_id="carol")
                np.testing.assert_array_equal(a.state, b.state)
            finally:
                await svc.aclose()

        asyncio.run(main())
