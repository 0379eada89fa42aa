"""``get_data`` answers what was asked, within ``max_response_bytes`` as it goes on the
wire, and within a per-tenant byte budget over time (issue 43 item 6): a 3 KB request
answered 333 MiB because the per-call bound counted the tensors, not their base64 in a
JSON answer, and nothing bounded how fast one tenant made the server build answers."""

from __future__ import annotations

from typing import Any

import numpy as np

from joynexus.server import ServerConfig
from joynexus.server.config import TenantQuotas
from joynexus.server.wire import answer_nbytes
from joynexus.wire import MSGPACK_MEDIA_TYPE, unpackb
from tests.server.conftest import Server, run, server

ROW = 256  # float32 values per sample of x: 1 KiB
URL = "/v1/queue/partitions/p/get_data"


async def _fill(srv: Server, tenant: str, rows: int, row: int = ROW) -> np.ndarray:
    x = np.arange(rows * row, dtype=np.float32).reshape(rows, row)
    code, body = await srv.msgpack(
        "POST",
        "/v1/queue/partitions/p/put",
        tenant,
        {
            "data": {"x": x, "y": np.zeros((rows, 3), np.float32)},
            "metadata": {"schema_signature": "s"},
        },
    )
    assert code == 201, body
    return x


async def _read(srv: Server, tenant: str, ref: dict[str, Any], *, msgpack: bool) -> Any:
    headers = {**srv.auth(tenant), "Content-Type": "application/json"}
    if msgpack:
        headers["Accept"] = MSGPACK_MEDIA_TYPE
    return await srv.client.post(URL, json=ref, headers=headers)


def test_the_answer_holds_the_rows_and_fields_asked_and_its_size_is_bounded() -> None:
    async def main() -> None:
        async with server() as srv:
            x = await _fill(srv, "alice", 4)
            ref = {"indexes": [2, 0, 2], "fields": ["x"]}
            tensors = 3 * ROW * 4
            for msgpack in (True, False):
                r = await _read(srv, "alice", ref, msgpack=msgpack)
                assert r.status_code == 200, r.text
                data = unpackb(r.content)["data"] if msgpack else r.json()["data"]
                assert set(data) == {"x"}  # y was not asked for
                got = data["x"] if msgpack else np.frombuffer(_b64(data["x"]), np.float32)
                np.testing.assert_array_equal(np.asarray(got).reshape(3, ROW), x[[2, 0, 2]])
                # The bytes sent are the bytes the bound counted, to within the framing.
                bound = answer_nbytes(tensors, 1, msgpack=msgpack)
                carried = tensors if msgpack else 4 * tensors // 3
                assert carried <= len(r.content) <= bound, (msgpack, len(r.content), bound)

    run(main)


def _b64(value: dict[str, Any]) -> bytes:
    import base64

    return base64.b64decode(value["data"])


def test_a_json_answer_is_bounded_as_sent_not_as_its_tensors() -> None:
    """900 KiB of tensors is 1.2 MiB of JSON: over a 1 MiB ``max_response_bytes``."""

    async def main() -> None:
        async with server(config=ServerConfig(max_response_bytes=1 << 20)) as srv:
            await _fill(srv, "alice", 900)
            ref = {"indexes": list(range(900)), "fields": ["x"]}
            r = await _read(srv, "alice", ref, msgpack=True)
            assert r.status_code == 200
            assert len(r.content) <= 1 << 20
            r = await _read(srv, "alice", ref, msgpack=False)
            body = r.json()
            assert r.status_code == 422 and body["code"] == "limit_exceeded", body
            assert body["details"]["size_bytes"] == 900 * ROW * 4
            assert body["details"]["answer_bytes"] > 1 << 20
            assert "max_response_bytes" in body["message"] and "msgpack" in body["message"]

    run(main)


def test_the_read_budget_refuses_past_its_rate_and_refills_with_time() -> None:
    quotas = TenantQuotas(read_bytes_per_s=100_000, read_burst_bytes=300_000)

    async def main() -> None:
        async with server() as srv:
            await srv.add_tenant("carol", quotas)
            await _fill(srv, "carol", 100)
            ref = {"indexes": list(range(100)), "fields": ["x"]}  # 100 KiB, msgpack
            cost = answer_nbytes(100 * ROW * 4, 1, msgpack=True)
            for _ in range(300_000 // cost):  # the burst
                assert (await _read(srv, "carol", ref, msgpack=True)).status_code == 200
            r = await _read(srv, "carol", ref, msgpack=True)
            body = r.json()
            assert r.status_code == 429 and body["code"] == "quota_exceeded", body
            assert body["details"]["reason"] == "read_bytes"
            retry = body["details"]["retry_after_s"]
            left = 300_000 - (300_000 // cost) * cost
            assert retry == (cost - left) / 100_000
            assert int(r.headers["Retry-After"]) >= 1
            # Another tenant's budget is its own.
            await _fill_other(srv)
            srv.clock.advance(retry * 0.5)
            assert (await _read(srv, "carol", ref, msgpack=True)).status_code == 429
            srv.clock.advance(retry)
            assert (await _read(srv, "carol", ref, msgpack=True)).status_code == 200

    run(main)


async def _fill_other(srv: Server) -> None:
    code, _ = await srv.msgpack(
        "POST",
        "/v1/queue/partitions/q/put",
        "bob",
        {"data": {"x": np.ones((1, ROW), np.float32)}, "metadata": {"schema_signature": "s"}},
    )
    assert code == 201
    r = await srv.client.post(
        "/v1/queue/partitions/q/get_data",
        json={"indexes": [0], "fields": ["x"]},
        headers={**srv.auth("bob"), "Accept": MSGPACK_MEDIA_TYPE},
    )
    assert r.status_code == 200


def test_a_read_larger_than_the_burst_is_a_422_that_says_to_page() -> None:
    quotas = TenantQuotas(read_bytes_per_s=1e9, read_burst_bytes=50_000)

    async def main() -> None:
        async with server() as srv:
            await srv.add_tenant("carol", quotas)
            await _fill(srv, "carol", 100)
            r = await _read(
                srv, "carol", {"indexes": list(range(100)), "fields": ["x"]}, msgpack=True
            )
            body = r.json()
            assert r.status_code == 422 and body["code"] == "limit_exceeded", body
            assert "read_burst_bytes" in body["message"] and "split" in body["message"]

    run(main)


def test_a_read_that_fails_costs_no_budget() -> None:
    quotas = TenantQuotas(read_bytes_per_s=1.0, read_burst_bytes=120_000)

    async def main() -> None:
        async with server() as srv:
            await srv.add_tenant("carol", quotas)
            await _fill(srv, "carol", 100)
            # Index 100 does not exist: refused after the budget was charged, refunded.
            bad = {"indexes": [*range(99), 100], "fields": ["x"]}
            r = await _read(srv, "carol", bad, msgpack=True)
            assert r.status_code == 400 and "indexes" in r.json()["message"], r.text
            good = {"indexes": list(range(100)), "fields": ["x"]}
            assert (await _read(srv, "carol", good, msgpack=True)).status_code == 200

    run(main)
