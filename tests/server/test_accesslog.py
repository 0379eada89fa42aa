"""API keys never reach the access log, even when a URL carries one in its query."""

from __future__ import annotations

import logging
import re
import threading
import time

import httpx
import uvicorn
from fastapi import APIRouter
from uvicorn.logging import AccessFormatter

from joynexus.control.scheduler import TrainingScheduler
from joynexus.queues.training import TrainingQueue
from joynexus.server import ServiceRegistry, TenantStore, create_app
from joynexus.server.accesslog import RedactKeysFilter, escape_controls, redact_keys
from joynexus.server.routes import dashboard
from joynexus.services.environment import EnvironmentService
from tests.server.conftest import run, server


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s'))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def test_redact_keys_hides_key_like_query_values_only() -> None:
    line = "GET /dashboard?interval=3&key=jnx_abc_def&api_key=jnx_x;token=t#frag HTTP/1.1"
    out = redact_keys(line)
    assert "jnx_" not in out and "=t" not in out
    assert "interval=3" in out and out.count("[redacted]") == 3 and "#frag" in out
    assert redact_keys("/v1/me?monkey=1") == "/v1/me?monkey=1"  # not a key parameter


def test_a_key_in_the_query_is_not_in_uvicorns_access_log() -> None:
    store = TenantStore.in_memory()
    secret = store.create_admin_key().api_key
    app = create_app(
        services=ServiceRegistry(
            tenants=store,
            scheduler=TrainingScheduler.in_memory(),
            training_queue=TrainingQueue(),
            environment=EnvironmentService(),
        ),
        extra_routers=(dashboard.router,),
    )
    # uvicorn sets up its loggers here (replacing their handlers, keeping filters).
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="info", lifespan="on")
    access = logging.getLogger("uvicorn.access")
    assert any(isinstance(f, RedactKeysFilter) for f in access.filters)
    capture = _Capture()
    access.addHandler(capture)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not srv.started:  # startup readiness, not a timing assertion
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        port = srv.servers[0].sockets[0].getsockname()[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            r = client.get(f"/dashboard?key={secret}&interval=500", follow_redirects=False)
            assert r.status_code == 303
            assert r.headers["location"] == f"/dashboard?interval=500#key={secret}"
            client.get(f"/v1/me?key={secret}")
        deadline = time.monotonic() + 10
        while len(capture.lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        srv.should_exit = True
        thread.join(timeout=30)
        access.removeHandler(capture)
    assert len(capture.lines) >= 2, capture.lines
    text = "\n".join(capture.lines)
    assert "/dashboard?key=[redacted]&interval=500" in text, text
    assert secret not in text and secret.split("_")[1] not in text


def test_the_dashboard_moves_a_query_key_into_the_fragment() -> None:
    async def main() -> None:
        async with server(extra_routers=(dashboard.router,)) as srv:
            r = await srv.client.get("/dashboard", params={"key": "jnx_a_b"})
            assert r.status_code == 303 and r.headers["location"] == "/dashboard#key=jnx_a_b"
            assert r.headers["referrer-policy"] == "no-referrer"
            r = await srv.client.get("/dashboard", params={"interval": "300"})
            assert r.status_code == 200 and "text/html" in r.headers["content-type"]

    run(main)


def test_escape_controls_writes_every_control_character_as_an_escape() -> None:
    assert escape_controls("a\nb\x0b\x1b[2J\x7f\x85é ok") == "a\\x0ab\\x0b\\x1b[2J\\x7f\\x85é ok"


def test_a_decoded_path_reaches_the_error_log_with_its_controls_escaped() -> None:
    """A route that fails on a path holding ``%0B%1B``: the error log names the path,
    without the raw control characters the client had the server decode."""
    boom = APIRouter()

    @boom.get("/v1/boom/{anything}")
    async def fail(anything: str) -> None:
        raise RuntimeError("unexpected")

    capture = _Records()
    errors = logging.getLogger("joynexus.server")
    errors.addHandler(capture)

    async def main() -> None:
        async with server(extra_routers=(boom,), raise_app_exceptions=False) as srv:
            r = await srv.client.get("/v1/boom/x%0A%0BFORGED%1B%5B2J")
            assert r.status_code == 500

    try:
        run(main)
    finally:
        errors.removeHandler(capture)
    text = "\n".join(capture.lines)
    assert "\\x0bFORGED\\x1b[2J" in text, text  # (the URL parser drops the newline)
    assert re.search(r"[\x00-\x09\x0b-\x1f\x7f]", text) is None, text
    assert not any(line.startswith("FORGED") for line in text.splitlines()), text


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record).split("\nTraceback")[0])
