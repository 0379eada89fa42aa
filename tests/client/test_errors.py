"""A refused call's exception says why: the server's reason is in its text.

Regression: a user printing the exception (or reading a traceback) saw the status and
had to dig the reason out of the response; the server's message must be in ``str()``.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from joynexus.client import APIError, AsyncClient, Client, RetryPolicy
from joynexus.errors import AuthenticationError
from joynexus.server.errors import install_error_handlers

NO_RETRY = RetryPolicy(max_retries=0)
REASON = "the API key is not valid; ask an admin for a tenant key"


def _server() -> FastAPI:
    """An app answering every route with the server's real error handlers."""
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/v1/tenants")
    async def refuse() -> None:
        raise AuthenticationError(REASON)

    return app


def test_the_async_clients_error_text_carries_the_servers_reason() -> None:
    async def call() -> APIError:
        transport = httpx.ASGITransport(app=_server())
        async with AsyncClient("http://jnx", "k", retry=NO_RETRY, transport=transport) as c:
            with pytest.raises(APIError) as caught:
                await c.list_tenants()
        return caught.value

    exc = asyncio.run(call())
    assert exc.status == 401
    assert str(exc) == f"HTTP 401 {exc.code}: {REASON}"


def test_the_sync_clients_error_text_carries_the_servers_reason() -> None:
    body = {"code": "quota_exceeded", "message": "completion target reached", "details": {}}
    transport = httpx.MockTransport(lambda _request: httpx.Response(429, json=body))
    with (
        Client("http://jnx", "k", retry=NO_RETRY, transport=transport) as c,
        pytest.raises(APIError) as caught,
    ):
        c.list_tenants()
    assert str(caught.value) == "HTTP 429 quota_exceeded: completion target reached"


def test_a_body_not_of_ours_is_still_the_reason() -> None:
    transport = httpx.MockTransport(lambda _r: httpx.Response(502, text="upstream down\n"))
    with (
        Client("http://jnx", "k", retry=NO_RETRY, transport=transport) as c,
        pytest.raises(APIError) as caught,
    ):
        c.list_tenants()
    assert str(caught.value) == "HTTP 502 http_error: upstream down"
