"""No server at the URL: one line saying so and how to point elsewhere, no traceback.

Regression: ``joynexus tenants list`` (and every client command) with no server running
printed a 245-line ``httpx.ConnectError`` traceback.
"""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.client import APIError, AsyncClient, Client, RetryPolicy, ServerUnreachableError

FAST = RetryPolicy(max_retries=1, backoff_s=0.0)


def _closed_port() -> int:
    """A port nobody listens on (bound once to pick it, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def url() -> str:
    return f"http://127.0.0.1:{_closed_port()}"


def test_client_raises_one_clean_error_after_its_retries(url: str) -> None:
    delays: list[float] = []
    with (
        Client(url, "k", retry=FAST, sleep=delays.append) as c,
        pytest.raises(ServerUnreachableError) as caught,
    ):
        c.list_tenants()
    err = caught.value
    assert delays == [0.0]  # retried once, as the policy says
    assert isinstance(err, APIError) and isinstance(err, httpx.TransportError)
    assert (err.status, err.code, err.details) == (0, "unreachable", {"url": url})
    text = str(err)
    assert text.startswith(f"no server answers at {url} (")
    assert "JOYNEXUS_URL" in text and "--url" in text and "\n" not in text


def test_async_client_too(url: str) -> None:
    async def go() -> None:
        async def no_sleep(_: float) -> None:
            return None

        async with AsyncClient(url, "k", retry=FAST, sleep=no_sleep) as c:
            await c.list_tenants()

    with pytest.raises(ServerUnreachableError, match="no server answers at"):
        asyncio.run(go())


@pytest.mark.parametrize(
    "args",
    [
        ["tenants", "list"],
        ["status", "--once"],
        ["usage"],
        ["scale", "rollout", "2"],
    ],
)
def test_cli_commands_print_one_line(
    args: list[str], url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("joynexus.client.sync.RetryPolicy", lambda: FAST)
    monkeypatch.setattr("joynexus.client.sync.time.sleep", lambda _: None)
    result = CliRunner().invoke(app, [*args, "--url", url, "--api-key", "k"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not a crash
    assert "Traceback" not in result.output
    flat = " ".join(result.output.split())  # rich wraps at the test console's width
    assert flat.startswith(f"error: no server answers at {url} (")
    assert "JOYNEXUS_URL" in flat
    assert len(result.output.strip().splitlines()) <= 3


def test_the_url_comes_from_joynexus_url_too(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("joynexus.client.sync.RetryPolicy", lambda: FAST)
    monkeypatch.setattr("joynexus.client.sync.time.sleep", lambda _: None)
    result = CliRunner().invoke(app, ["usage"], env={"JOYNEXUS_URL": url})
    assert result.exit_code == 1
    assert result.output.count("\n") == 1  # exactly one line
    assert f"no server answers at {url}" in result.output
