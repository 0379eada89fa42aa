"""The client retries 429 and 503 with exponential backoff, honouring Retry-After."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from joynexus.client import APIError, AsyncClient, Client, RetryPolicy
from joynexus.server import TenantQuotas
from tests.server.livesrv import make_live, uvicorn_thread


def _flaky(statuses: list[int], retry_after: str | None = None) -> httpx.MockTransport:
    calls = iter(statuses)

    def handler(request: httpx.Request) -> httpx.Response:
        code = next(calls, 200)
        if code == 200:
            return httpx.Response(200, json=[])
        headers = {"Retry-After": retry_after} if retry_after else {}
        return httpx.Response(
            code, json={"code": "unavailable", "message": "busy", "details": {}}, headers=headers
        )

    return httpx.MockTransport(handler)


def test_503_backs_off_exponentially_then_succeeds() -> None:
    sleeps: list[float] = []
    policy = RetryPolicy(max_retries=5, backoff_s=0.1, max_backoff_s=10)
    with Client(
        "http://x", "k", transport=_flaky([503, 503, 503]), retry=policy, sleep=sleeps.append
    ) as c:
        assert c.list_workloads() == []
    assert sleeps == pytest.approx([0.1, 0.2, 0.4])


def test_retry_after_wins_and_retries_are_bounded() -> None:
    sleeps: list[float] = []
    policy = RetryPolicy(max_retries=2, backoff_s=0.1)
    with (
        Client(
            "http://x", "k", transport=_flaky([429] * 5, "3"), retry=policy, sleep=sleeps.append
        ) as c,
        pytest.raises(APIError) as err,
    ):
        c.list_workloads()
    assert err.value.status == 429 and err.value.code == "unavailable"
    assert sleeps == [3.0, 3.0]


def test_async_client_retries_too() -> None:
    sleeps: list[float] = []

    async def record(s: float) -> None:
        sleeps.append(s)

    calls = iter([503, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        code = next(calls)
        return httpx.Response(
            code, json=[] if code == 200 else {"code": "unavailable", "message": ""}
        )

    async def main() -> None:
        async with AsyncClient(
            "http://x", "k", transport=httpx.MockTransport(handler), sleep=record
        ) as c:
            assert await c.list_workloads() == []

    asyncio.run(main())
    assert len(sleeps) == 1


def test_rate_quota_429_is_retried_against_a_live_server(tmp_path: Path, tiny_model: str) -> None:
    srv = make_live(tmp_path, tiny_model)
    admin = srv.tenants.create_admin_key().api_key
    with uvicorn_thread(srv.app) as url:
        with Client(url, admin) as a:
            quotas = TenantQuotas(requests_per_s=20.0, burst=1).model_dump()
            key = a.create_tenant("alice", quotas)["api_key"]
        sleeps: list[float] = []

        def short_sleep(s: float) -> None:
            sleeps.append(s)
            import time

            time.sleep(0.06)  # enough for the 20/s bucket to refill one token

        with Client(url, key, sleep=short_sleep) as c:
            for _ in range(4):
                assert c.list_workloads() == []
        assert sleeps and all(s >= 1.0 for s in sleeps)  # Retry-After (whole seconds) honoured
