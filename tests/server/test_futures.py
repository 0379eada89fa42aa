"""Futures: submit, poll, long-poll on the FakeClock, errors, cancel, delete, tenant scope,
expiry (long unread, short once read), and a cap that bounds pending work, not history."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from joynexus.errors import SpecError
from joynexus.server import ServerConfig, TenantQuotas
from joynexus.server.futures import FutureRef
from joynexus.server.state import ServerState, TenantPrincipal, tenant_id_of
from tests.server.conftest import run, server


def _router(gates: dict[str, asyncio.Event]) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/test/ops/{name}", status_code=202)
    async def start(name: str, request: Request, principal: TenantPrincipal) -> FutureRef:
        state: ServerState = request.app.state.joynexus
        gate = gates.setdefault(name, asyncio.Event())

        async def work() -> dict[str, Any]:
            await gate.wait()
            if name.startswith("bad"):
                raise SpecError("the spec names an unknown head", allowed=["oft"])
            if name.startswith("bug"):
                raise KeyError("internal detail")
            return {"name": name}

        quotas = state.quotas_of(tenant_id_of(principal))
        return state.futures.submit(
            tenant_id_of(principal), "test", work, max_pending=quotas.max_pending_futures
        )

    return router


def test_futures_lifecycle() -> None:
    gates: dict[str, asyncio.Event] = {}

    async def main() -> None:
        config = ServerConfig(future_retention_s=60.0, max_long_poll_s=10.0)
        async with server(config=config, extra_routers=[_router(gates)]) as srv:
            c, alice = srv.client, srv.auth("alice")
            fid = (await c.post("/v1/test/ops/ok", headers=alice)).json()["future_id"]
            r = await c.get(f"/v1/futures/{fid}", headers=alice)
            assert r.json()["state"] == "pending" and r.json()["result"] is None

            # A long poll returns when the clock passes `wait` (FakeClock: no real waiting).
            poll = asyncio.create_task(c.get(f"/v1/futures/{fid}?wait=5", headers=alice))
            while srv.clock.pending_sleepers == 0:
                await asyncio.sleep(0)
            assert not poll.done()
            srv.clock.advance(5.0)
            assert (await poll).json()["state"] == "pending"

            # ... and early when the operation finishes.
            poll = asyncio.create_task(c.get(f"/v1/futures/{fid}?wait=5", headers=alice))
            while srv.clock.pending_sleepers == 0:
                await asyncio.sleep(0)
            gates["ok"].set()
            done = (await poll).json()
            assert done["state"] == "succeeded" and done["result"] == {"name": "ok"}

            # Another tenant's future answers exactly as an unknown one (no oracle).
            r = await c.get(f"/v1/futures/{fid}", headers=srv.auth("bob"))
            assert r.status_code == 404 and r.json()["code"] == "not_found"
            unknown = await c.get("/v1/futures/fut-0-none", headers=alice)
            assert unknown.status_code == 404
            assert r.json()["message"].replace(fid, "X") == unknown.json()["message"].replace(
                "fut-0-none", "X"
            )

            bad = (await c.post("/v1/test/ops/bad", headers=alice)).json()["future_id"]
            bug = (await c.post("/v1/test/ops/bug", headers=alice)).json()["future_id"]
            gates["bad"].set()
            gates["bug"].set()
            err = await srv.wait_future("alice", bad)
            assert err["state"] == "failed" and err["error"]["code"] == "invalid_spec"
            assert err["error"]["details"] == {"allowed": ["oft"]}
            err = await srv.wait_future("alice", bug)
            assert err["error"]["code"] == "internal_error" and "internal detail" not in str(err)

            slow = (await c.post("/v1/test/ops/slow", headers=alice)).json()["future_id"]
            assert (await c.delete(f"/v1/futures/{slow}", headers=alice)).status_code == 200
            assert (await srv.wait_future("alice", slow))["state"] == "cancelled"

            listed = {f["future_id"] for f in (await c.get("/v1/futures", headers=alice)).json()}
            assert listed == {fid, bad, bug, slow}
            assert (await c.get("/v1/futures", headers=srv.auth("bob"))).json() == []
            srv.clock.advance(61.0)  # finished futures expire after the retention time
            assert (await c.get(f"/v1/futures/{fid}", headers=alice)).status_code == 404

    run(main)


def test_pending_futures_quota() -> None:
    gates: dict[str, asyncio.Event] = {}

    async def main() -> None:
        async with server(tenants=(), extra_routers=[_router(gates)]) as srv:
            await srv.add_tenant("alice", TenantQuotas(max_pending_futures=2))
            alice = srv.auth("alice")
            for name in ("a", "b"):
                assert (await srv.client.post(f"/v1/test/ops/{name}", headers=alice)).is_success
            r = await srv.client.post("/v1/test/ops/c", headers=alice)
            assert r.status_code == 429 and r.json()["details"]["reason"] == "pending_futures"
            gates["a"].set()
            await asyncio.sleep(0.01)
            assert (await srv.client.post("/v1/test/ops/d", headers=alice)).status_code == 202

    run(main)


def test_finished_futures_never_lock_a_tenant_out() -> None:
    """Issue 12: after 256 futures (even failed ones) every future call answered 429."""
    gates: dict[str, asyncio.Event] = {}

    async def main() -> None:
        async with server(extra_routers=[_router(gates)]) as srv:
            c, alice = srv.client, srv.auth("alice")
            gates["bad"] = asyncio.Event()
            gates["bad"].set()
            limit = ServerConfig().max_futures_per_tenant
            for i in range(limit + 44):
                r = await c.post("/v1/test/ops/bad", headers=alice)
                assert r.status_code == 202, (i, r.text)
                await asyncio.sleep(0)  # let it fail
            # History is bounded (oldest finished forgotten first), never a lock-out.
            held = (await c.get("/v1/futures", headers=alice)).json()
            assert len(held) <= limit and all(f["state"] == "failed" for f in held)

    run(main)


def test_finished_futures_can_be_deleted_and_expire_soon_after_a_read() -> None:
    gates: dict[str, asyncio.Event] = {}

    async def main() -> None:
        config = ServerConfig(future_retention_s=3600.0, future_read_retention_s=30.0)
        async with server(config=config, extra_routers=[_router(gates)]) as srv:
            c, alice, bob = srv.client, srv.auth("alice"), srv.auth("bob")
            ids = {}
            for name in ("read", "unread", "deleted"):
                ids[name] = (await c.post(f"/v1/test/ops/{name}", headers=alice)).json()[
                    "future_id"
                ]
                gates[name].set()
                assert (await srv.wait_future("alice", ids[name]))["state"] == "succeeded"
            # wait_future read "read" (and the two others): the short retention applies.
            # A finished future can be deleted at once; bob cannot delete alice's.
            r = await c.delete(f"/v1/futures/{ids['deleted']}", headers=bob)
            assert r.status_code == 404
            r = await c.delete(f"/v1/futures/{ids['deleted']}", headers=alice)
            assert r.status_code == 200 and r.json()["state"] == "succeeded"
            assert (await c.get(f"/v1/futures/{ids['deleted']}", headers=alice)).status_code == 404
            srv.clock.advance(31.0)
            assert (await c.get(f"/v1/futures/{ids['read']}", headers=alice)).status_code == 404

            # Never read: kept the long retention for a late poller.
            late = (await c.post("/v1/test/ops/late", headers=alice)).json()["future_id"]
            gates["late"].set()
            for _ in range(100):
                await asyncio.sleep(0)
            srv.clock.advance(600.0)
            r = await c.get(f"/v1/futures/{late}", headers=alice)
            assert r.status_code == 200 and r.json()["state"] == "succeeded"
            srv.clock.advance(31.0)  # ... and that read starts the short retention
            assert (await c.get(f"/v1/futures/{late}", headers=alice)).status_code == 404

            # A pending future: DELETE cancels it; its poller still sees "cancelled".
            slow = (await c.post("/v1/test/ops/slow", headers=alice)).json()["future_id"]
            assert (await c.delete(f"/v1/futures/{slow}", headers=alice)).status_code == 200
            assert (await srv.wait_future("alice", slow))["state"] == "cancelled"
            r = await c.delete(f"/v1/futures/{slow}", headers=alice)  # now finished: gone
            assert r.status_code == 200 and r.json()["state"] == "cancelled"
            assert (await c.get(f"/v1/futures/{slow}", headers=alice)).status_code == 404

    run(main)
