"""One end-to-end check against a real uvicorn server on 127.0.0.1 (ephemeral port)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import uvicorn

from joynexus.control.scheduler import TrainingScheduler
from joynexus.queues.training import TrainingQueue
from joynexus.server import ServiceRegistry, TenantStore, create_app
from joynexus.services.environment import EnvironmentService
from joynexus.wire import MSGPACK_MEDIA_TYPE, packb, unpackb


@pytest.fixture
def live_server() -> Iterator[tuple[str, str]]:
    store = TenantStore.in_memory()
    admin = store.create_admin_key().api_key
    app = create_app(
        services=ServiceRegistry(
            tenants=store,
            scheduler=TrainingScheduler.in_memory(),
            training_queue=TrainingQueue(),
            environment=EnvironmentService(),
        )
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:  # startup readiness, not a timing assertion
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", admin
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_real_server_round_trip(live_server: tuple[str, str]) -> None:
    url, admin = live_server
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/healthz").json() == {"status": "ok", "checks": {}}
        assert client.get("/v1/me").status_code == 401
        r = client.post(
            "/v1/tenants",
            json={"tenant_id": "alice"},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert r.status_code == 201
        auth = {"Authorization": f"Bearer {r.json()['api_key']}"}
        images = np.random.default_rng(0).integers(0, 255, (4, 32, 32, 3), dtype=np.uint8)
        r = client.post(
            "/v1/queue/partitions/my-data/put",
            content=packb({"data": {"obs.cam": images}, "metadata": {"schema_signature": "s"}}),
            headers={**auth, "Content-Type": MSGPACK_MEDIA_TYPE},
        )
        assert r.status_code == 201, r.text
        r = client.post(
            "/v1/queue/partitions/my-data/get_data",
            json={"indexes": [3, 1], "fields": ["obs.cam"]},
            headers={**auth, "Accept": MSGPACK_MEDIA_TYPE},
        )
        assert r.headers["content-type"] == MSGPACK_MEDIA_TYPE
        np.testing.assert_array_equal(unpackb(r.content)["data"]["obs.cam"], images[[3, 1]])
        assert r.headers["x-request-id"]
        assert client.get("/openapi.json").json()["info"]["version"] == "v1"
