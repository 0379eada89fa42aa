"""Bounded schemathesis fuzzing of every OpenAPI operation: no 5xx, still healthy after.

Two runs over a server with a durable (SQLite) scheduler and small body limits:
schema-conforming inputs, and *negative* ones that break the schema (integers beyond
their ``maximum``, over-long strings and lists, wrong types): those must be 4xx, never
a 5xx such as an integer SQLite cannot store. Every body above its route's limit must
answer 413.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from joynexus.control.scheduler import TrainingScheduler
from joynexus.queues.training import TrainingQueue
from joynexus.server import ServerConfig, ServiceRegistry, TenantQuotas, TenantStore, create_app
from joynexus.services.environment import EnvironmentService
from joynexus.wire import MSGPACK_MEDIA_TYPE, packb

schemathesis = pytest.importorskip("schemathesis")


@schemathesis.serializer(MSGPACK_MEDIA_TYPE)  # type: ignore[untyped-decorator]
def _msgpack(context: Any, value: Any) -> bytes:
    try:
        return packb(value)
    except (TypeError, OverflowError):  # ints beyond 64 bits: send an invalid body instead
        return b"\xc1"


_store = TenantStore.in_memory()
_store.create_tenant(
    # No sessions: a fuzzed spec must not start simulator processes; 429 is a fine answer.
    "fuzzer",
    quotas=TenantQuotas(max_sessions=0, requests_per_s=1e6, burst=1_000_000),
)
_KEY = _store.create_key("fuzzer").api_key
_ADMIN_KEY = _store.create_admin_key().api_key
_DIR = Path(tempfile.mkdtemp(prefix="joynexus-fuzz-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
_BULK_LIMIT, _JSON_LIMIT = 1 << 20, 16 << 10
_APP = create_app(
    # No long polls: a fuzzed ?wait= must not hold the test for max_long_poll_s.
    config=ServerConfig(
        max_long_poll_s=0.0, max_body_bytes=_BULK_LIMIT, max_json_body_bytes=_JSON_LIMIT
    ),
    services=ServiceRegistry(
        tenants=_store,
        # SQLite, as in `joynexus serve`: an integer beyond 64 bits would be a 500 here.
        scheduler=TrainingScheduler.open(_DIR / "scheduler.sqlite"),
        training_queue=TrainingQueue(memory_cap_bytes=1 << 20),
        environment=EnvironmentService(),
    ),
)
schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)
negative = schemathesis.openapi.from_asgi("/openapi.json", _APP)
negative.config.generation.update(modes=[schemathesis.GenerationMode.NEGATIVE])


def _check(case: Any) -> None:
    key = _ADMIN_KEY if case.path.startswith("/v1/tenants") else _KEY
    response = case.call(headers={"Authorization": f"Bearer {key}"})
    assert response.status_code < 500, (case.method, case.path, response.text)
    if response.status_code >= 400 and response.content:
        assert set(response.json()) == {"code", "message", "details"}
    body = response.request.body
    sent = len(body) if isinstance(body, bytes | str) else 0
    operation = _APP.openapi()["paths"][case.path].get(case.method.lower(), {})
    tensors = "application/msgpack" in operation.get("requestBody", {}).get("content", {})
    if sent > (_BULK_LIMIT if tensors else _JSON_LIMIT):
        assert response.status_code == 413, (case.method, case.path, response.text)


@schema.parametrize()  # type: ignore[untyped-decorator]
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_operation_answers_5xx(case: Any) -> None:
    _check(case)


@negative.parametrize()  # type: ignore[untyped-decorator]
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_inputs_that_break_the_schema_answer_4xx(case: Any) -> None:
    _check(case)


def test_server_is_healthy_after_fuzzing() -> None:
    from starlette.testclient import TestClient

    with TestClient(_APP) as client:
        assert client.get("/healthz").json()["status"] == "ok"
        assert client.get("/readyz").status_code == 200
        me = client.get("/v1/me", headers={"Authorization": f"Bearer {_KEY}"})
        assert me.status_code == 200
