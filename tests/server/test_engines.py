"""``/v1/admin/engines``: scale a live server's rollout engines 1 → 2 → 1, draining.

The server runs on an in-process engine pool (as ``joynexus serve --runtime local``).
A predict held on the engine that scaling in removes must complete before the engine
is released; the scale-in request answers only then.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from joynexus.runtime.hosting import EnginePoolPlacement
from joynexus.services.inference import InferenceModelService
from tests.runtime.test_scaling import obs, tenant
from tests.server.livesrv import live


def _admin(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _gate(engine: Any, gate: asyncio.Event) -> None:
    """Hold ``engine``'s predicts until ``gate`` is set."""
    predict = engine.predict

    async def held(*args: Any, **kwargs: Any) -> Any:
        await gate.wait()
        return await predict(*args, **kwargs)

    engine.predict = held


def test_admin_scales_rollout_engines_and_scale_in_drains(tmp_path: Path, tiny_model: str) -> None:
    async def body() -> None:
        placement = EnginePoolPlacement(engines=1, max_engines=2)
        async with live(
            tmp_path / "run", tiny_model, tenants=("alice",), placement=placement
        ) as lv:
            c, admin = lv.client, _admin(lv.admin_key)
            pool = lv.srv.plane.pool
            assert pool is not None
            r = await c.get("/v1/admin/engines", headers=admin)
            assert r.status_code == 200, r.text
            assert r.json()["engines"] == 1 and r.json()["max_engines"] == 2

            # Errors: a tenant key, fewer than one engine, more than the bound.
            r = await c.get("/v1/admin/engines", headers=lv.auth("alice"))
            assert r.status_code == 403, r.text
            r = await c.post("/v1/admin/engines", json={"engines": 0}, headers=admin)
            assert r.status_code == 422, r.text
            r = await c.post("/v1/admin/engines", json={"engines": 3}, headers=admin)
            assert r.status_code == 409, r.text
            assert "at most 2" in r.json()["message"]
            assert pool.size == 1

            await pool.add_tenant(tenant("a"))
            r = await c.post("/v1/admin/engines", json={"engines": 2}, headers=admin)
            assert r.status_code == 200, r.text
            doc = r.json()
            assert doc["engines"] == 2
            assert [e["state"] for e in doc["pool"]] == ["serving", "warming"]
            first, second = pool.engine_ids()
            leaving = pool.engine(second)
            assert isinstance(leaving, InferenceModelService)
            assert leaving.current_policy_version("a") == 0  # synced on admission

            # Hold predicts on both engines until one sits on the engine that will leave.
            gates = {first: asyncio.Event(), second: asyncio.Event()}
            for engine_id, gate in gates.items():
                _gate(pool.engine(engine_id), gate)
            calls: list[asyncio.Task[Any]] = []

            def in_flight(engine_id: int) -> int:
                return next(s.in_flight for s in pool.status() if s.engine_id == engine_id)

            while in_flight(second) == 0:
                assert len(calls) < 20, pool.status()
                calls.append(asyncio.create_task(pool.predict(obs(), "a")))
                await asyncio.sleep(0.01)
            gates[first].set()

            scale_in = asyncio.create_task(
                c.post("/v1/admin/engines", json={"engines": 1}, headers=admin)
            )
            for _ in range(200):  # the leaving engine drains: no new calls, still held
                await asyncio.sleep(0.01)
                states = {s.engine_id: s.state for s in pool.status()}
                if states.get(second) == "draining":
                    break
            assert states[second] == "draining"
            await asyncio.sleep(0.1)
            assert not scale_in.done() and leaving.inference_queue.running
            extra = await pool.predict(obs(), "a")  # new calls go to the staying engine
            assert extra.policy_version == 0

            gates[second].set()
            results = await asyncio.gather(*calls)
            assert all(res.policy_version == 0 for res in results)  # the held one completed
            r = await scale_in
            assert r.status_code == 200, r.text
            assert r.json()["engines"] == 1
            assert [e["engine_id"] for e in r.json()["pool"]] == [first]
            assert not leaving.inference_queue.running  # released after draining

    asyncio.run(body())


def test_engines_route_conflicts_without_a_pool(tmp_path: Path, tiny_model: str) -> None:
    async def body() -> None:
        async with live(tmp_path / "run", tiny_model, tenants=()) as lv:
            admin = _admin(lv.admin_key)
            r = await lv.client.post("/v1/admin/engines", json={"engines": 2}, headers=admin)
            assert r.status_code == 409, r.text
            assert "EnginePoolPlacement" in r.json()["message"]
            r = await lv.client.get("/v1/admin/engines", headers=admin)
            assert r.status_code == 409, r.text

    asyncio.run(body())


def test_scale_rollout_cli_talks_to_a_running_server(tmp_path: Path, tiny_model: str) -> None:
    import json

    from typer.testing import CliRunner

    from joynexus.cli.main import app
    from tests.server.livesrv import make_live, uvicorn_thread

    srv = make_live(
        tmp_path / "run", tiny_model, placement=EnginePoolPlacement(engines=1, max_engines=2)
    )
    admin = srv.tenants.create_admin_key().api_key
    runner = CliRunner()
    with uvicorn_thread(srv.app) as url:
        env = {"JOYNEXUS_URL": url, "JOYNEXUS_API_KEY": admin}
        out = runner.invoke(app, ["scale", "rollout", "2", "--json"], env=env)
        assert out.exit_code == 0, out.output
        assert json.loads(out.output)["engines"] == 2
        out = runner.invoke(app, ["scale", "rollout", "1"], env=env)
        assert out.exit_code == 0, out.output
        assert "2 → 1 engine(s)" in out.output
        out = runner.invoke(app, ["scale", "rollout", "5"], env=env)
        assert out.exit_code == 1 and "409" in out.output, out.output
