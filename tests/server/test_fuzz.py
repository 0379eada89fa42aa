"""Bounded schemathesis fuzzing of every OpenAPI operation: no 5xx, still healthy after."""

from __future__ import annotations

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
_APP = create_app(
    # No long polls: a fuzzed ?wait= must not hold the test for max_long_poll_s.
    config=ServerConfig(max_long_poll_s=0.0, max_body_bytes=1 << 20),
    services=ServiceRegistry(
        tenants=_store,
        scheduler=TrainingScheduler.in_memory(),
        training_queue=TrainingQueue(memory_cap_bytes=1 << 20),
        environment=EnvironmentService(),
    ),
)
schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)


@schema.parametrize()  # type: ignore[untyped-decorator]
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_operation_answers_5xx(case: Any) -> None:
    key = _ADMIN_KEY if case.path.startswith("/v1/tenants") else _KEY
    response = case.call(headers={"Authorization": f"Bearer {key}"})
    assert response.status_code < 500, (case.method, case.path, response.text)
    if response.status_code >= 400 and response.content:
        assert set(response.json()) == {"code", "message", "details"}


def test_server_is_healthy_after_fuzzing() -> None:
    from starlette.testclient import TestClient

    with TestClient(_APP) as client:
        assert client.get("/healthz").json()["status"] == "ok"
        assert client.get("/readyz").status_code == 200
        me = client.get("/v1/me", headers={"Authorization": f"Bearer {_KEY}"})
        assert me.status_code == 200
