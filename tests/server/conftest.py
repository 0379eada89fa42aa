"""A JoyNexus server over in-memory services, driven in process (httpx + ASGITransport)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import APIRouter, FastAPI

from joynexus.control.scheduler import TrainingScheduler
from joynexus.queues.training import TrainingQueue
from joynexus.server import ServerConfig, ServiceRegistry, TenantQuotas, TenantStore, create_app
from joynexus.services.environment import EnvironmentService
from joynexus.utils.clock import FakeClock
from joynexus.wire import MSGPACK_MEDIA_TYPE, packb, unpackb
from tests.envs.fake_envs import ensure_registered
from tests.server.livesrv import reach_demos, tiny_model  # noqa: F401  (live-server fixtures)

ensure_registered()

MSGPACK = {"Content-Type": MSGPACK_MEDIA_TYPE, "Accept": MSGPACK_MEDIA_TYPE}


@dataclass
class Server:
    app: FastAPI
    client: httpx.AsyncClient
    clock: FakeClock
    services: ServiceRegistry
    admin_key: str
    keys: dict[str, str] = field(default_factory=dict)

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"}

    async def add_tenant(self, tenant: str, quotas: TenantQuotas | None = None) -> str:
        body: dict[str, Any] = {"tenant_id": tenant}
        if quotas is not None:
            body["quotas"] = quotas.model_dump()
        r = await self.client.post("/v1/tenants", json=body, headers=self.admin)
        assert r.status_code == 201, r.text
        self.keys[tenant] = r.json()["api_key"]
        return self.keys[tenant]

    async def msgpack(
        self, method: str, url: str, tenant: str, body: Any = None, *, json: Any = None
    ) -> tuple[int, Any]:
        """Send ``body`` as msgpack (or ``json`` as JSON); accept a msgpack answer."""
        headers = {**MSGPACK, **self.auth(tenant)}
        if json is not None:
            headers["Content-Type"] = "application/json"
        r = await self.client.request(
            method,
            url,
            content=None if body is None else packb(body),
            json=json,
            headers=headers,
        )
        if r.headers.get("content-type", "").startswith(MSGPACK_MEDIA_TYPE):
            return r.status_code, unpackb(r.content)
        return r.status_code, (r.json() if r.content else None)

    async def wait_future(self, tenant: str, future_id: str) -> dict[str, Any]:
        """Poll a future until it finishes (real time: futures of real workers)."""
        for _ in range(600):
            r = await self.client.get(
                f"/v1/futures/{future_id}", headers=self.auth(tenant), params={"wait": 0}
            )
            assert r.status_code == 200, r.text
            status: dict[str, Any] = r.json()
            if status["state"] != "pending":
                return status
            await asyncio.sleep(0.05)
        raise AssertionError(f"future {future_id} did not finish")


@asynccontextmanager
async def server(
    *,
    tenants: Sequence[str] = ("alice", "bob"),
    config: ServerConfig | None = None,
    extra_routers: Sequence[APIRouter] = (),
    raise_app_exceptions: bool = True,
    memory_cap_bytes: int | None = None,
    scheduler_path: Path | None = None,
) -> AsyncIterator[Server]:
    clock = FakeClock()
    store = TenantStore.in_memory(clock=clock)
    services = ServiceRegistry(
        tenants=store,
        scheduler=(
            TrainingScheduler.in_memory(clock=clock)
            if scheduler_path is None
            else TrainingScheduler.open(scheduler_path, clock=clock)
        ),
        training_queue=TrainingQueue(memory_cap_bytes=memory_cap_bytes),
        environment=EnvironmentService(clock=clock),
    )
    app = create_app(config=config, services=services, clock=clock, extra_routers=extra_routers)
    admin_key = store.create_admin_key().api_key
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        srv = Server(app, client, clock, services, admin_key)
        try:
            for tenant in tenants:
                await srv.add_tenant(tenant)
            yield srv
        finally:
            await app.state.joynexus.futures.aclose()
            await services.environment.aclose()
            if scheduler_path is not None:
                services.scheduler.close()


def run(fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(fn())
