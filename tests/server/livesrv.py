"""A live JoyNexus server over real services (tiny backbone) for the workload/model tests.

``live(...)`` drives the app in process (httpx + ASGITransport, lifespan entered by
hand); ``uvicorn_thread(app)`` serves it on 127.0.0.1 with an ephemeral port for the
client and the custom-algorithm example.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from joynexus.master.limits import MasterLimits
from joynexus.runtime.health import HealthManager
from joynexus.runtime.hosting import InProcess, Placement, RuntimeConfig
from joynexus.server import ServerConfig, TenantQuotas, TenantStore
from joynexus.server.serve import LiveServer, build_live_app, build_plane
from joynexus.spec.workload import BaseModelSpec


@dataclass
class Live:
    srv: LiveServer
    client: httpx.AsyncClient
    admin_key: str
    keys: dict[str, str] = field(default_factory=dict)

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    async def submit(self, tenant: str, spec: dict[str, Any]) -> httpx.Response:
        return await self.client.post("/v1/workloads", json=spec, headers=self.auth(tenant))

    async def status(self, tenant: str, wid: str) -> dict[str, Any]:
        r = await self.client.get(f"/v1/workloads/{wid}/status", headers=self.auth(tenant))
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    async def wait_state(
        self, tenant: str, wid: str, states: Sequence[str], timeout_s: float = 120
    ) -> dict[str, Any]:
        """Poll until the workload reaches one of ``states`` (real services: real time)."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = await self.status(tenant, wid)
            if st["state"] in states:
                return st
            assert st["state"] not in ("failed", "cancelled") or "failed" in states, st
            assert time.monotonic() < deadline, f"workload {wid} stuck: {st}"
            await asyncio.sleep(0.05)


def make_live(
    run_dir: Path,
    model: str,
    *,
    limits: MasterLimits | None = None,
    config: ServerConfig | None = None,
    health: HealthManager | None = None,
    placement: Placement = InProcess(),
) -> LiveServer:
    runtime = RuntimeConfig(poll_s=0.02, max_wait_s=0.002)
    plane = build_plane(run_dir, BaseModelSpec(id=model), placement=placement, config=runtime)
    store = TenantStore.in_memory()
    return build_live_app(
        plane,
        store,
        output_root=run_dir / "outputs",
        config=config,
        limits=limits,
        runtime=runtime,
        health=health,
    )


@asynccontextmanager
async def live(
    run_dir: Path,
    model: str,
    *,
    tenants: Sequence[str] = ("alice", "bob"),
    quotas: dict[str, TenantQuotas] | None = None,
    limits: MasterLimits | None = None,
    health: HealthManager | None = None,
    placement: Placement = InProcess(),
) -> AsyncIterator[Live]:
    srv = make_live(run_dir, model, limits=limits, health=health, placement=placement)
    admin = srv.tenants.create_admin_key().api_key
    async with srv.app.router.lifespan_context(srv.app):
        transport = httpx.ASGITransport(app=srv.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", timeout=60
        ) as client:
            out = Live(srv, client, admin)
            for t in tenants:
                body: dict[str, Any] = {"tenant_id": t}
                if quotas and t in quotas:
                    body["quotas"] = quotas[t].model_dump()
                r = await client.post(
                    "/v1/tenants", json=body, headers={"Authorization": f"Bearer {admin}"}
                )
                assert r.status_code == 201, r.text
                out.keys[t] = r.json()["api_key"]
            yield out


@contextmanager
def uvicorn_thread(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1:<ephemeral>; yields the base URL."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:  # startup readiness, not a timing assertion
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def reach_rl(tenant: str, model: str, *, target: int = 2, **algo: Any) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "task": "rl",
        "base_model": {"id": model},
        "env": {"kind": "reach2d", "num_envs": 2, "image_size": 32, "max_episode_steps": 6},
        "algorithm": {"name": "ppo", "horizon": 8, "microbatch_size": 16, **algo},
        "action_module": {"type": "oft", "hidden_dim": 32, "num_blocks": 1},
        "scheduling": {"completion_target": target, "max_in_flight": 2},
    }


def tenant_dataset_root(root: Path, dataset: Path, *tenants: str) -> Path:
    """A served dataset root holding a copy of ``dataset`` in each tenant's own folder
    (``<root>/<tenant>/<name>``); specs name it ``<name>``."""
    for tenant in tenants:
        shutil.copytree(dataset, root / tenant / dataset.name)
    return root


def reach_sft(tenant: str, model: str, dataset: Path, *, target: int = 2) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "task": "sft",
        "base_model": {"id": model},
        "dataset": {"path": str(dataset), "heldout_fraction": 0.2},
        "action_module": {"type": "oft", "hidden_dim": 32, "num_blocks": 1},
        "algorithm": {"name": "sft", "samples_per_job": 16, "microbatch_size": 16},
        "scheduling": {"completion_target": target, "prefetch": 2},
    }


def reach_custom(tenant: str, model: str) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "task": "custom",
        "base_model": {"id": model},
        "env": {"kind": "reach2d", "num_envs": 2, "image_size": 32},
        "algorithm": {"name": "reinforce"},
        "action_module": {"type": "oft", "hidden_dim": 32, "num_blocks": 1},
    }


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen2.5-VL saved once per session; specs name it by path like a hub id."""
    from joynexus.models.tiny import make_tiny

    return str(make_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "qwen"))


@pytest.fixture(scope="session")
def reach_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small reach2d demonstration dataset (8 expert episodes, 32 px)."""
    from tests.workflows.helpers import record_reach2d_demos

    return record_reach2d_demos(tmp_path_factory.mktemp("demos") / "reach2d", episodes=8)
