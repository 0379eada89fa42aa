"""The Training Queue and Training Scheduler primitives of Figure 4 through the clients.

Regression: neither client could ``queue_put``, ``get_meta``, ``get_data``, ``put``,
``lease_stage``, ``heartbeat`` or ``fail`` (the server had the routes, the clients
did not), so a client-side algorithm could not use the queue or the scheduler. The sync
client drives one RL job through every stage of Table 4 against a real server
(uvicorn); the async client, whose calls come from the same definitions, does the
producer's half and the failure path in process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from joynexus.client import APIError, AsyncClient, Client
from tests.server.livesrv import make_live, uvicorn_thread

JOB = {
    "policy_key": "alice.custom",
    "domain": "reach2d",
    "task_type": "rl",
    "sample_count": 4,
    "producer_role": "rollout",
    "consumer_role": "learner",
    "behavior_policy_version": 0,
}
META = {"schema_signature": "reach2d.alice", "behavior_policy_version": 0}


def test_sync_client_drives_one_rl_job_through_queue_and_scheduler(
    tmp_path: Path, tiny_model: str
) -> None:
    srv = make_live(tmp_path / "run", tiny_model)
    admin = srv.tenants.create_admin_key().api_key
    with uvicorn_thread(srv.app) as url:
        with Client(url, admin) as c:
            key = c.create_tenant("alice")["api_key"]
        with Client(url, key) as c:
            assert c.lease("learner", ["reach2d"]) is None  # nothing ready yet
            job = c.reserve(**JOB)
            assert job["state"] == "reserved" and job["consumer_role"] == "learner"
            pid, epoch = job["partition_id"], job["lease_epoch"]
            assert c.heartbeat(job["job_id"], epoch)["lease_epoch"] == epoch
            reward = np.array([0.0, 1.0, 2.0, 3.0], np.float32)
            obs = np.arange(4 * 3, dtype=np.float32).reshape(4, 3)
            assert c.queue_put(pid, {"obs": obs, "reward": reward}, META) == [0, 1, 2, 3]
            assert c.mark(job["job_id"], "needs_advantages", epoch)["state"] == "needs_advantages"

            stage = c.lease_stage("needs_advantages", "computing_advantages", "learner", "reach2d")
            assert stage is not None and stage["state"] == "computing_advantages"
            meta = c.get_meta(pid, ["reward"], 4, "adv")
            assert meta["indexes"] == [0, 1, 2, 3]
            got = c.get_data(meta)
            np.testing.assert_array_equal(got["reward"], reward)
            c.put(meta, {"advantage": got["reward"] - got["reward"].mean()})
            assert c.mark(stage["job_id"], "ready", stage["lease_epoch"])["state"] == "ready"

            leased = c.lease("learner", ["reach2d"])
            assert leased is not None and leased["job_id"] == job["job_id"]
            batch = c.get_data(c.get_meta(pid, ["obs", "advantage"], 4, "learner"))
            np.testing.assert_array_equal(batch["obs"], obs)
            np.testing.assert_allclose(batch["advantage"], [-1.5, -0.5, 0.5, 1.5])
            done = c.complete(leased["job_id"], leased["lease_epoch"], {"loss": 0.25})
            assert done["state"] == "completed" and done["metadata"]["loss"] == 0.25
            c.clear(pid)
            assert c.partitions() == []
            assert [j["state"] for j in c.jobs()] == ["completed"]
            assert c.job(job["job_id"])["state"] == "completed"
            # A stale lease is refused with the server's reason, not a silent success.
            with pytest.raises(APIError) as err:
                c.heartbeat(job["job_id"], epoch)
            assert 400 <= err.value.status < 500


def test_async_client_produces_and_fails_a_job(tmp_path: Path, tiny_model: str) -> None:
    srv = make_live(tmp_path / "run", tiny_model)
    admin = srv.tenants.create_admin_key().api_key

    async def main() -> None:
        async with srv.app.router.lifespan_context(srv.app):
            transport = httpx.ASGITransport(app=srv.app)
            async with AsyncClient("http://testserver", admin, transport=transport) as c:
                key = (await c.create_tenant("alice"))["api_key"]
            async with AsyncClient("http://testserver", key, transport=transport) as c:
                job = await c.reserve(**JOB)
                pid = job["partition_id"]
                await c.heartbeat(job["job_id"], job["lease_epoch"])
                data = {"obs": np.ones((4, 2), np.float32)}
                assert await c.queue_put(pid, data, [META] * 4) == [0, 1, 2, 3]
                meta = await c.get_meta(pid, ["obs"], 8, "peek")
                assert meta["indexes"] == [0, 1, 2, 3]
                got = await c.get_data(meta)
                np.testing.assert_array_equal(got["obs"], data["obs"])
                failed = await c.fail(job["job_id"], "client gave up", job["lease_epoch"])
                assert failed["state"] == "failed"
                empty = await c.lease_stage("reserved", "computing_actor_forward", "learner", "x")
                assert empty is None
                await c.clear(pid)
                assert await c.partitions() == []
                assert [j["state"] for j in await c.jobs(state="failed")] == ["failed"]

    asyncio.run(main())
