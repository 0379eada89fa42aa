"""Environment sessions over HTTP: the gym allow-list and the server's env limits."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from joynexus.master.limits import MasterLimits
from joynexus.server import ServerConfig
from tests.server.conftest import run, server
from tests.server.livesrv import live, reach_custom


async def _create(srv: Any, spec: dict[str, Any]) -> Any:
    return await srv.client.post("/v1/env/sessions", headers=srv.auth("alice"), json={"spec": spec})


def test_tenants_cannot_make_the_server_import_modules_or_pass_kwargs(tmp_path: Path) -> None:
    probe = tmp_path / "jnx_import_probe.py"
    probe.write_text("raise SystemExit('imported a module a tenant named')\n")
    sys.path.insert(0, str(tmp_path))

    async def main() -> None:
        async with server() as srv:
            cases = [
                ({"imports": ["jnx_import_probe"]}, "CartPole-v1", "gym_allowed_imports"),
                (
                    {"make_kwargs": {"render_mode": "human"}},
                    "CartPole-v1",
                    "gym_allowed_make_kwargs",
                ),
                ({}, "jnx_import_probe:Env-v0", "gym_allowed_ids"),
            ]
            for options, task, setting in cases:
                r = await _create(srv, {"kind": "gym", "task": task, "options": options})
                assert r.status_code == 403, r.text
                body = r.json()
                assert (
                    body["code"] == "permission_denied"
                    and f"ServerConfig.{setting}" in body["message"]
                )
            assert "jnx_import_probe" not in sys.modules
            r = await srv.client.get("/v1/env/sessions", headers=srv.auth("alice"))
            assert r.json() == []  # nothing was started

    try:
        run(main)
    finally:
        sys.path.remove(str(tmp_path))


def test_an_admin_allowlist_lets_the_listed_options_through() -> None:
    config = ServerConfig(
        gym_allowed_imports=["json"], gym_allowed_make_kwargs=["sutton_barto_reward"]
    )

    async def main() -> None:
        async with server(config=config) as srv:
            spec = {
                "kind": "gym",
                "task": "CartPole-v1",
                "image_size": 16,
                "options": {"imports": ["json"], "make_kwargs": {"sutton_barto_reward": True}},
            }
            r = await _create(srv, spec)
            assert r.status_code == 202, r.text
            done = await srv.wait_future("alice", r.json()["future_id"])
            assert done["state"] == "succeeded", done
            assert done["result"]["schema"]["action_dim"] == 1

    run(main)


def test_sessions_obey_the_env_limits_of_workloads() -> None:
    async def main() -> None:
        async with server() as srv:  # no Master: the defaults of MasterLimits
            r = await _create(srv, {"kind": "fake", "num_envs": 17})
            assert r.status_code == 422, r.text
            assert r.json()["details"]["fields"] == ["spec.num_envs"]
            assert "max_num_envs" in r.json()["message"]
            r = await _create(srv, {"kind": "fake", "image_size": 1024})
            assert r.status_code == 422 and "max_image_size" in r.json()["message"]
            r = await _create(srv, {"kind": "remote", "options": {"url": "http://x"}})
            assert r.status_code == 403 and r.json()["details"]["fields"] == ["spec.kind"]

    run(main)


def test_sessions_and_workloads_share_the_masters_limits(tmp_path: Path, tiny_model: str) -> None:
    async def main() -> None:
        limits = MasterLimits(max_num_envs=2, max_image_size=32)
        async with live(tmp_path, tiny_model, limits=limits) as lv:
            h = lv.auth("alice")
            spec = {"kind": "reach2d", "num_envs": 3, "image_size": 64}
            r = await lv.client.post("/v1/env/sessions", headers=h, json={"spec": spec})
            assert r.status_code == 422, r.text
            assert set(r.json()["details"]["fields"]) == {"spec.num_envs", "spec.image_size"}
            assert "limit of 2" in r.json()["message"]
            wl = reach_custom("alice", tiny_model)
            wl["env"] = {**wl["env"], "num_envs": 3}
            r = await lv.submit("alice", wl)
            assert r.status_code == 422 and "env.num_envs" in r.json()["details"]["fields"]

            # A gym workload may not import modules either (compiling it builds the env).
            gym = reach_custom("alice", tiny_model)
            gym["env"] = {"kind": "gym", "task": "CartPole-v1", "options": {"imports": ["os"]}}
            r = await lv.submit("alice", gym)
            assert r.status_code == 403, r.text
            assert "ServerConfig.gym_allowed_imports" in r.json()["message"]
            assert r.json()["details"]["fields"] == ["env.options.imports"]

    asyncio.run(main())
