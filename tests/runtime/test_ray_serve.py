"""``joynexus serve --runtime ray``: the HTTP API over services that are Ray actors.

The Master Service and the server stay in this process; the plane is built with a
:class:`RayPlacement`. A tiny reach2d RL workload is submitted through the app
(in-process ASGI client) and runs to completion while an admin scales the rollout
engine actors 1 → 2 (the new actor synced to the published weights) and back to 1.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from joynexus.control.job import JobState
from joynexus.runtime.health import HealthManager
from joynexus.runtime.hosting import RuntimeConfig
from joynexus.runtime.plane import build_plane
from joynexus.runtime.ray_hosting import RayPlacement
from joynexus.runtime.ray_proxy import ActorProxy
from joynexus.runtime.scaling import EnginePool
from joynexus.server import TenantStore
from joynexus.server.serve import build_live_app
from joynexus.spec.workload import BaseModelSpec
from tests.server.livesrv import Live, reach_rl

pytestmark = pytest.mark.ray


def test_serve_runs_a_workload_on_ray_actors(
    ray_cluster: None, tmp_path: Path, tiny_model: str
) -> None:
    async def body() -> None:
        run_dir = tmp_path / "run"
        plane = build_plane(
            run_dir,
            BaseModelSpec(id=tiny_model),
            placement=RayPlacement(layout="cpu", max_engines=2),
            config=RuntimeConfig(poll_s=0.02, max_wait_s=0.002),
        )
        try:
            # Every service of the plane is an actor (the scheduler stays here); the
            # rollout engines are actors behind the pool in this process.
            for svc in (plane.queue, plane.env, plane.training):
                assert isinstance(svc, ActorProxy), svc
            pool = plane.inference
            assert isinstance(pool, EnginePool) and pool is plane.pool
            store = TenantStore.in_memory()
            health = HealthManager(heartbeat_timeout_s=None, check_interval_s=0.2)
            srv = build_live_app(
                plane,
                store,
                output_root=run_dir / "outputs",
                runtime=RuntimeConfig(poll_s=0.02),
                health=health,
            )
            admin = store.create_admin_key().api_key
            async with srv.app.router.lifespan_context(srv.app):
                transport = httpx.ASGITransport(app=srv.app)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://testserver", timeout=120
                ) as client:
                    lv = Live(srv, client, admin)
                    r = await client.post(
                        "/v1/tenants",
                        json={"tenant_id": "alice"},
                        headers={"Authorization": f"Bearer {admin}"},
                    )
                    assert r.status_code == 201, r.text
                    lv.keys["alice"] = r.json()["api_key"]
                    r = await lv.submit("alice", reach_rl("alice", tiny_model, target=2))
                    assert r.status_code in (200, 201, 202), r.text
                    wid = r.json()["workload_id"]
                    admin_auth = {"Authorization": f"Bearer {admin}"}
                    st = await lv.wait_state("alice", wid, ["running", "completed"])
                    r = await client.post(
                        "/v1/admin/engines", json={"engines": 2}, headers=admin_auth
                    )
                    assert r.status_code == 200, r.text
                    assert r.json()["engines"] == 2
                    added = pool.engine(pool.engine_ids()[1])
                    assert isinstance(added, ActorProxy)
                    served = pool.current_policy_version("alice")
                    assert added.current_policy_version("alice") >= served  # synced
                    assert "inference/1" in health.roles()
                    done = await lv.wait_state("alice", wid, ["completed"], timeout_s=240)
                    assert done["jobs_completed"] >= 2, (done, st)
                    r = await client.post(
                        "/v1/admin/engines", json={"engines": 1}, headers=admin_auth
                    )
                    assert r.status_code == 200, r.text
                    assert [e["engine_id"] for e in r.json()["pool"]] == [0]
            jobs = plane.scheduler.list_jobs(tenant_id="alice")
            assert jobs and all(j.is_terminal for j in jobs)
            assert sum(j.state is JobState.COMPLETED for j in jobs) >= 2
            assert health.escalated is None
        finally:
            plane.close()

    asyncio.run(body())
