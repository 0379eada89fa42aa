"""One request or one tenant must not take the service down (issue 28 items 1, 2, 11,
12): bounded reads and predictions, values that cannot be stored refused before they
are, a refused body answered so the client reads it, and probes that name nobody."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn

from joynexus.control.scheduler import TrainingScheduler
from joynexus.queues.training import TrainingQueue
from joynexus.server import ServerConfig, ServiceRegistry, TenantStore, create_app
from joynexus.server.routes.health import READINESS
from joynexus.services.environment import EnvironmentService
from joynexus.wire import MSGPACK_MEDIA_TYPE, packb, unpackb
from tests.server.conftest import run, server
from tests.server.livesrv import live, reach_custom

MSGPACK = {"Content-Type": MSGPACK_MEDIA_TYPE, "Accept": MSGPACK_MEDIA_TYPE}


def sync(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run an async test body on a fresh event loop."""

    def wrapper() -> None:
        run(test)

    wrapper.__name__ = test.__name__
    return wrapper


JOB = {
    "policy_key": "vla",
    "domain": "d",
    "task_type": "sft",
    "sample_count": 1,
    "producer_role": "p",
    "consumer_role": "c",
}


# ----------------------------------------------------------------- item 1: get_data


@sync
async def test_get_data_bounds_indexes_and_response_bytes() -> None:
    config = ServerConfig(max_response_bytes=1 << 20, max_get_data_indexes=64)
    async with server(config=config) as srv:
        sample = np.arange(65_536, dtype=np.float32)[None]  # one 256 KiB sample
        code, _ = await srv.msgpack(
            "POST",
            "/v1/queue/partitions/p/put",
            "alice",
            {"data": {"x": sample}, "metadata": {"schema_signature": "s"}},
        )
        assert code == 201
        url = "/v1/queue/partitions/p/get_data"
        # A small request naming one sample many times would be a huge answer.
        code, body = await srv.msgpack(
            "POST", url, "alice", json={"indexes": [0] * 8, "fields": ["x"]}
        )
        assert code == 422 and body["code"] == "limit_exceeded", body
        assert "max_response_bytes" in body["message"] and body["details"]["size_bytes"] == 8 << 18
        code, body = await srv.msgpack(
            "POST", url, "alice", json={"indexes": [0] * 65, "fields": ["x"]}
        )
        assert code == 422 and "max_get_data_indexes" in body["message"], body
        # Within both limits (the answer's framing counts too): answered, rows in order.
        code, body = await srv.msgpack(
            "POST", url, "alice", json={"indexes": [0] * 3, "fields": ["x"]}
        )
        assert code == 200
        np.testing.assert_array_equal(body["data"]["x"], np.repeat(sample, 3, axis=0))


@sync
async def test_get_data_index_count_is_bounded_by_default() -> None:
    async with server() as srv:
        code, _ = await srv.msgpack(
            "POST",
            "/v1/queue/partitions/p/put",
            "alice",
            {"data": {"x": np.zeros((1, 1), np.float32)}, "metadata": {"schema_signature": "s"}},
        )
        assert code == 201
        limit = ServerConfig().max_get_data_indexes
        code, body = await srv.msgpack(
            "POST",
            "/v1/queue/partitions/p/get_data",
            "alice",
            json={"indexes": [0] * (limit + 1), "fields": ["x"]},
        )
        assert code == 422 and str(limit) in body["message"], body


# ------------------------------------------------------------ item 2: predict bounds


def test_predict_rows_and_text_are_bounded(tmp_path: Path, tiny_model: str) -> None:
    def obs(n: int, text: str = "reach") -> dict[str, Any]:
        return {
            "cameras": {"top": np.zeros((n, 32, 32, 3), np.uint8)},
            "state": np.zeros((n, 4), np.float32),
            "instructions": [text] * n,
        }

    async def main() -> None:
        async with live(tmp_path, tiny_model) as lv:
            r = await lv.submit("alice", reach_custom("alice", tiny_model))
            await lv.wait_state("alice", r.json()["workload_id"], ["running"])

            async def predict(body: dict[str, Any]) -> tuple[int, Any]:
                r = await lv.client.post(
                    "/v1/models/alice/predict",
                    content=packb({"observations": body}),
                    headers={**MSGPACK, **lv.auth("alice")},
                )
                return r.status_code, (unpackb(r.content) if r.status_code == 200 else r.json())

            rows = ServerConfig().max_predict_rows
            code, body = await predict(obs(rows + 1))
            assert code == 422 and "max_predict_rows" in body["message"], body
            chars = ServerConfig().max_predict_text_chars
            n = chars // 4096 + 1
            code, body = await predict(obs(n, "x" * 4096))
            assert code == 422 and "max_predict_text_chars" in body["message"], body
            code, body = await predict(obs(5))
            assert code == 200 and body["actions"].shape[0] == 5

    run(main)


# ----------------------------------------------------- item 11: surrogates, big bodies


@sync
async def test_a_lone_surrogate_in_job_metadata_is_refused_before_it_is_stored() -> None:
    async with server() as srv:

        async def post(url: str, body: dict[str, Any]) -> httpx.Response:
            # json.dumps spells a lone surrogate as the escape "\\ud800": valid JSON.
            headers = {**srv.auth("alice"), "Content-Type": "application/json"}
            return await srv.client.post(url, content=json.dumps(body), headers=headers)

        r = await post("/v1/scheduler/jobs", {**JOB, "metadata": {"k": "\ud800"}})
        assert r.status_code == 422, r.text
        assert "not valid Unicode" in r.text
        r = await post("/v1/scheduler/jobs", {**JOB, "metadata": {"\udfff": [1, {"x": 2}]}})
        assert r.status_code == 422, r.text
        r = await srv.client.get("/v1/scheduler/jobs", headers=srv.auth("alice"))
        assert r.status_code == 200 and r.json() == [], r.text  # nothing was stored
        r = await post("/v1/scheduler/jobs", JOB)
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        r = await post(f"/v1/scheduler/jobs/{job_id}/complete", {"metadata": {"k": ["\ud800"]}})
        assert r.status_code == 422, r.text
        r = await srv.client.get("/v1/scheduler/jobs", headers=srv.auth("alice"))
        assert r.status_code == 200 and len(r.json()) == 1


@pytest.fixture
def live_url() -> Iterator[tuple[str, str]]:
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
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:  # startup readiness, not a timing assertion
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = srv.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", admin
    finally:
        srv.should_exit = True
        thread.join(timeout=30)


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-response"
        rest += chunk
    return int(lines[0].split()[1]), headers, rest[:length]


def test_a_60_mb_json_body_gets_a_readable_413(live_url: tuple[str, str]) -> None:
    url, admin = live_url
    host, port = url.removeprefix("http://").split(":")
    body = b'{"tenant_id": "' + b"x" * (60 << 20) + b'"}'
    head = (
        f"POST /v1/tenants HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {admin}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        # Like curl or requests: the whole body goes out before the answer is read. A
        # server that answers and closes meanwhile resets the connection mid-send.
        sock.sendall(head + body)
        status, headers, payload = _read_response(sock)
        assert status == 413, payload
        assert "max_json_body_bytes" in json.loads(payload)["message"]
        # Drained, not broken: the same connection serves the next request.
        assert headers.get("connection") != "close", headers
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert _read_response(sock)[0] == 200


# ------------------------------------------------------- item 4: manual reservations


@sync
async def test_reservations_held_by_hand_are_bounded_per_tenant() -> None:
    async with server(config=ServerConfig(max_reserved_jobs_per_tenant=2)) as srv:
        rl = {**JOB, "task_type": "rl"}
        for _ in range(2):
            r = await srv.client.post("/v1/scheduler/jobs", json=rl, headers=srv.auth("alice"))
            assert r.status_code == 201, r.text
        r = await srv.client.post("/v1/scheduler/jobs", json=rl, headers=srv.auth("alice"))
        assert r.status_code == 429, r.text
        assert "max_reserved_jobs_per_tenant" in r.json()["message"]
        # Another tenant has its own bound; marking one ready frees a place.
        r = await srv.client.post("/v1/scheduler/jobs", json=rl, headers=srv.auth("bob"))
        assert r.status_code == 201, r.text
        job = (await srv.client.get("/v1/scheduler/jobs", headers=srv.auth("alice"))).json()[0]
        r = await srv.client.post(
            f"/v1/scheduler/jobs/{job['job_id']}/mark",
            json={"state": "needs_advantages", "lease_epoch": job["lease_epoch"]},
            headers=srv.auth("alice"),
        )
        assert r.status_code == 200, r.text
        r = await srv.client.post("/v1/scheduler/jobs", json=rl, headers=srv.auth("alice"))
        assert r.status_code == 201, r.text


# -------------------------------------------------------- item 12: ids and readiness


@sync
async def test_ids_are_random_tokens_not_counters() -> None:
    async with server() as srv:
        ids = []
        for _ in range(3):
            r = await srv.client.post("/v1/scheduler/jobs", json=JOB, headers=srv.auth("alice"))
            assert r.status_code == 201, r.text
            ids.append(r.json()["job_id"])
            assert re.fullmatch(r"job-[0-9a-f]{24}", ids[-1]), ids
        seqs = [
            j["created_seq"]
            for j in (await srv.client.get("/v1/scheduler/jobs", headers=srv.auth("alice"))).json()
        ]
        assert sorted(seqs) == [1, 2, 3]  # the ordering field stays


@sync
async def test_readyz_reports_counts_and_a_stalled_workload_keeps_it_ready() -> None:
    async with server() as srv:
        srv.services.extras[READINESS] = lambda: (None, {"stalled_workloads": 2})
        r = await srv.client.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["counts"] == {"stalled_workloads": 2}
        down = "a shared role spent its recovery budget; the live workloads were failed"
        srv.services.extras[READINESS] = lambda: (down, {"stalled_workloads": 0})
        r = await srv.client.get("/readyz")
        assert r.status_code == 503 and r.json()["checks"]["plane"] == f"degraded: {down}"


def test_readyz_of_a_live_server_names_no_workload(tmp_path: Path, tiny_model: str) -> None:
    async def main() -> None:
        async with live(tmp_path, tiny_model) as lv:
            r = await lv.submit("alice", reach_custom("alice", tiny_model))
            wid = r.json()["workload_id"]
            assert re.fullmatch(r"wl-[0-9a-f]{24}", wid), wid
            await lv.wait_state("alice", wid, ["running"])
            ready = await lv.client.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert wid not in ready.text and "alice" not in ready.text
            assert ready.json()["counts"] == {"stalled_workloads": 0}

    run(main)
