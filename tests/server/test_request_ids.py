"""Every request gets an id, echoed in the response and seen by the route (ASGI middleware)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from joynexus.server.errors import request_id
from tests.server.conftest import run, server


def _routes() -> APIRouter:
    router = APIRouter()

    @router.get("/v1/echo-id")
    async def echo(request: Request) -> dict[str, str]:
        return {"seen": request_id(request)}

    @router.get("/v1/stream-id")
    async def stream() -> StreamingResponse:
        async def chunks():  # type: ignore[no-untyped-def]
            yield b"a"
            yield b"b"

        return StreamingResponse(chunks())

    return router


def test_a_short_alphanumeric_client_id_is_kept_and_echoed() -> None:
    async def main() -> None:
        async with server(extra_routers=[_routes()]) as srv:
            r = await srv.client.get("/v1/echo-id", headers={"X-Request-ID": "Robot42"})
            assert r.status_code == 200
            assert r.json()["seen"] == "Robot42" == r.headers["x-request-id"]
            r = await srv.client.get("/v1/stream-id", headers={"X-Request-ID": "s1"})
            assert r.text == "ab" and r.headers["x-request-id"] == "s1"

    run(main)


def test_a_missing_long_or_odd_client_id_is_replaced_by_a_fresh_one() -> None:
    async def main() -> None:
        async with server(extra_routers=[_routes()]) as srv:
            seen: set[str] = set()
            for headers in ({}, {"X-Request-ID": "x" * 65}, {"X-Request-ID": "a b;c"}):
                r = await srv.client.get("/v1/echo-id", headers=headers)
                rid = r.headers["x-request-id"]
                assert r.json()["seen"] == rid and rid != headers.get("X-Request-ID")
                assert len(rid) == 32 and int(rid, 16) >= 0
                seen.add(rid)
            assert len(seen) == 3
            # A route's error body and header carry the same id as the response.
            r = await srv.client.get("/v1/nowhere", headers={"X-Request-ID": "lost1"})
            assert r.status_code == 404 and r.headers["x-request-id"] == "lost1"
            assert r.headers.get_list("x-request-id") == ["lost1"]

    run(main)
