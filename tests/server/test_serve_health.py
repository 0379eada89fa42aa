"""The live server's Health Manager: a SIGKILLed simulator worker is recreated in place.

The workload's env worker is killed right before its next ``step`` (deterministic: the
rollout that holds the session sees the dead worker). The ``environment`` role closes
and recreates the session with the same spec, the tenant's session id is swapped, the
event shows on the admin dashboard and the workload still completes.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from joynexus.runtime.health import HealthManager
from joynexus.services.environment import EnvironmentService
from tests.server.livesrv import live, reach_rl

TARGET = 4  # > max_in_flight + 1: at least one rollout starts after the kill


def _kill_on_next_step(env: EnvironmentService, victim: str, killed: list[dict[str, Any]]) -> None:
    step = env.step

    async def killing_step(session_id: str, actions: Any, *, tenant_id: str) -> Any:
        if not killed and tenant_id == victim:
            pid = env._sessions[session_id].worker.process.pid  # internals: the real process
            assert pid is not None
            os.kill(pid, signal.SIGKILL)  # no await until the step holds the session
            killed.append({"pid": pid, "session": session_id})
        return await step(session_id, actions, tenant_id=tenant_id)

    env.step = killing_step  # type: ignore[method-assign]  # the fault-injection hook


def test_env_worker_killed_under_serve(tmp_path: Path, tiny_model: str) -> None:
    async def body() -> None:
        health = HealthManager(heartbeat_timeout_s=None, check_interval_s=0.05)
        async with live(tmp_path / "run", tiny_model, tenants=("alice",), health=health) as lv:
            assert set(health.roles()) == {"environment", "inference", "training"}
            r = await lv.submit("alice", reach_rl("alice", tiny_model, target=TARGET))
            assert r.status_code in (200, 201, 202), r.text
            wid = r.json()["workload_id"]
            st = await lv.wait_state("alice", wid, ["running", "completed"])
            while st["jobs_completed"] < 1 and st["state"] != "completed":
                await asyncio.sleep(0.02)
                st = await lv.status("alice", wid)
            killed: list[dict[str, Any]] = []
            env = lv.srv.plane.env
            assert env.on_crash is not None  # the crash hook is wired
            _kill_on_next_step(env, "alice", killed)

            done = await lv.wait_state("alice", wid, ["completed"], timeout_s=180)
            assert killed, "the workload finished before the kill"
            assert done["jobs_completed"] >= TARGET, done
            assert done["session_id"] != killed[0]["session"]

            r = await lv.client.get(
                "/v1/dashboard/state", headers={"Authorization": f"Bearer {lv.admin_key}"}
            )
            assert r.status_code == 200, r.text
            events = r.json()["health"]["events"]
            env_kinds = [e["kind"] for e in events if e["role"] == "environment"]
            assert "restart_started" in env_kinds and "restarted" in env_kinds, events
            assert "restart_failed" not in env_kinds and health.escalated is None
            assert not any(e["role"] == "inference" and e["kind"] != "registered" for e in events)

    asyncio.run(body())
