"""Hostile or careless tenants over HTTP (issue 12): body sizes, integers, counts and
existence oracles. Each test reproduces what the server let through before."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from joynexus.server import ServerConfig, TenantQuotas
from joynexus.server.routes import workloads
from joynexus.wire import ND_EXT, packb, tensor_to_json
from tests.server.conftest import MSGPACK, Server, run, server

_JOB = {
    "policy_key": "p",
    "domain": "d",
    "task_type": "rl",
    "sample_count": 1,
    "producer_role": "prod",
    "consumer_role": "cons",
}


def _put(rows: int = 2, cols: int = 8) -> dict[str, Any]:
    return {
        "data": {"x": np.zeros((rows, cols), np.float32)},
        "metadata": {"schema_signature": "s"},
    }


async def _chunks(payload: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    """A body without Content-Length (httpx sends it chunked)."""
    for i in range(0, len(payload), size):
        yield payload[i : i + size]


def _is_413(r: Any, limit: int, setting: str) -> None:
    assert r.status_code == 413, r.text
    body = r.json()
    assert body["code"] == "payload_too_large" and str(limit) in body["message"], body
    assert body["details"]["limit_bytes"] == limit and setting in body["message"]
    assert r.headers["x-request-id"]


def test_every_route_limits_its_body_with_or_without_content_length() -> None:
    """Before: JSON routes read any body (a 200 MB job metadata, 200 MB session options)."""

    async def main() -> None:
        config = ServerConfig(max_json_body_bytes=2048, max_body_bytes=8192)
        async with server(config=config) as srv:
            c, alice = srv.client, srv.auth("alice")
            big_job = {**_JOB, "metadata": {"blob": "x" * 4000}}
            r = await c.post("/v1/scheduler/jobs", headers=alice, json=big_job)
            _is_413(r, 2048, "max_json_body_bytes")
            raw = json.dumps(big_job).encode()
            headers = {**alice, "Content-Type": "application/json"}
            r = await c.post("/v1/scheduler/jobs", headers=headers, content=_chunks(raw))
            _is_413(r, 2048, "max_json_body_bytes")
            spec = {"kind": "fake", "options": {"blob": "x" * 4000}}
            r = await c.post("/v1/env/sessions", headers=alice, json={"spec": spec})
            _is_413(r, 2048, "max_json_body_bytes")
            assert (await c.get("/v1/scheduler/jobs", headers=alice)).json() == []

            # Tensor routes have the larger bulk limit, chunked or not.
            mp = {**alice, **MSGPACK}
            ok = packb(_put(rows=100, cols=16))  # 6.4 kB: under 8 kB
            assert len(ok) > 2048
            r = await c.post("/v1/queue/partitions/mine/put", headers=mp, content=ok)
            assert r.status_code == 201, r.text
            big = packb(_put(rows=100, cols=32))
            r = await c.post("/v1/queue/partitions/mine/put", headers=mp, content=big)
            _is_413(r, 8192, "max_body_bytes")
            r = await c.post("/v1/queue/partitions/mine/put", headers=mp, content=_chunks(big))
            _is_413(r, 8192, "max_body_bytes")

            # Every route of the document that takes a body, both ways.
            for path, item in srv.app.openapi()["paths"].items():
                for method, op in item.items():
                    if "requestBody" not in op:
                        continue
                    url = re.sub(r"\{[^}]+\}", "x1", path)
                    kinds = op["requestBody"]["content"]
                    bulk = "application/msgpack" in kinds
                    limit = 8192 if bulk else 2048
                    payload = json.dumps({"pad": "y" * limit}).encode()
                    for content in (payload, _chunks(payload)):
                        r = await c.request(method, url, headers=headers, content=content)
                        assert r.status_code == 413, (method, path, r.text)
                        assert str(limit) in r.json()["message"]

    run(main)


def test_stored_job_metadata_is_bounded() -> None:
    """Before: any metadata under the body limit was stored with the job for good."""

    async def main() -> None:
        async with server(config=ServerConfig(max_job_metadata_bytes=1024)) as srv:
            c, alice = srv.client, srv.auth("alice")
            r = await c.post(
                "/v1/scheduler/jobs", headers=alice, json={**_JOB, "metadata": {"b": "x" * 2000}}
            )
            assert r.status_code == 413, r.text
            body = r.json()
            assert body["code"] == "payload_too_large"
            assert "max_job_metadata_bytes" in body["message"] and "1024" in body["message"]
            assert body["details"]["field"] == "metadata"

            # A complete that merges the job's metadata above the limit is refused too.
            sft = {**_JOB, "task_type": "sft", "metadata": {"a": "x" * 600}}
            job = (await c.post("/v1/scheduler/jobs", headers=alice, json=sft)).json()
            jid = job["job_id"]
            r = await c.post(
                f"/v1/scheduler/jobs/{jid}/mark", headers=alice, json={"state": "ready"}
            )
            assert r.status_code == 200, r.text
            lease = {"consumer_role": "cons", "domains": ["d"]}
            leased = (await c.post("/v1/scheduler/lease", headers=alice, json=lease)).json()["job"]
            done = {"lease_epoch": leased["lease_epoch"], "metadata": {"b": "y" * 600}}
            r = await c.post(f"/v1/scheduler/jobs/{jid}/complete", headers=alice, json=done)
            assert r.status_code == 413 and "max_job_metadata_bytes" in r.json()["message"]
            done["metadata"] = {"b": "ok"}
            r = await c.post(f"/v1/scheduler/jobs/{jid}/complete", headers=alice, json=done)
            assert r.status_code == 200 and r.json()["metadata"] == {"a": "x" * 600, "b": "ok"}

        async with server() as srv:  # the default: 64 KiB
            r = await srv.client.post(
                "/v1/scheduler/jobs",
                headers=srv.auth("alice"),
                json={**_JOB, "metadata": {"b": "x" * (100 << 10)}},
            )
            assert r.status_code == 413 and "65536" in r.json()["message"]

    run(main)


def test_integer_fields_are_bounded_at_the_api(tmp_path: Path) -> None:
    """Before: 2**80 in max_policy_staleness / behavior_policy_version was a 500 and a full
    reload of the SQLite scheduler."""

    async def main() -> None:
        async with server(
            scheduler_path=tmp_path / "scheduler.sqlite", extra_routers=[workloads.router]
        ) as srv:
            c, alice = srv.client, srv.auth("alice")
            for field in ("max_policy_staleness", "behavior_policy_version", "sample_count"):
                for value in (2**80, 2**63, -1):
                    r = await c.post(
                        "/v1/scheduler/jobs", headers=alice, json={**_JOB, field: value}
                    )
                    assert r.status_code == 422, (field, value, r.text)
                    body = r.json()
                    assert body["details"]["errors"][0]["loc"] == ["body", field]
                    assert field in body["message"]
            r = await c.post(
                "/v1/scheduler/jobs", headers=alice, json={**_JOB, "max_policy_staleness": 2**53}
            )
            assert r.status_code == 422  # the bound is 2**53 - 1: exact in any JSON parser

            # Queue fields: a sample's policy version, indexes.
            put = {
                "data": {"x": tensor_to_json(np.zeros((1, 2), np.float32))},
                "metadata": {"schema_signature": "s", "behavior_policy_version": 2**80},
            }
            r = await c.post("/v1/queue/partitions/mine/put", headers=alice, json=put)
            assert r.status_code == 422, r.text
            for route in ("get_data", "put_fields"):
                body: dict[str, Any] = {"indexes": [2**80], "fields": ["x"]}
                if route == "put_fields":
                    body = {"indexes": [2**80], "data": {"x": tensor_to_json(np.zeros(1))}}
                r = await c.post(f"/v1/queue/partitions/mine/{route}", headers=alice, json=body)
                assert r.status_code == 422, (route, r.text)

            # Tensor shapes: a dimension numpy cannot hold (even next to a 0) is a 4xx.
            empty = {"dtype": "float32", "shape": [0, 2**80], "data": ""}
            put = {"data": {"x": empty}, "metadata": {"schema_signature": "s"}}
            r = await c.post("/v1/queue/partitions/mine/put", headers=alice, json=put)
            assert r.status_code == 422 and "dimension above" in r.text, r.text
            ext = msgpack.ExtType(ND_EXT, msgpack.packb(["float32", [0, 2**62]]))
            raw = msgpack.packb({"data": {"x": ext}, "metadata": {"schema_signature": "s"}})
            r = await c.post(
                "/v1/queue/partitions/mine/put", headers={**alice, **MSGPACK}, content=raw
            )
            assert r.status_code == 400 and "dimension above" in r.text, r.text

            # Workload specs: every integer that reaches the scheduler is bounded.
            for section, field in (
                ("scheduling", "max_policy_staleness"),
                ("scheduling", "priority"),
                ("scheduling", "completion_target"),
                ("scheduling", "checkpoint_every"),
                ("algorithm", "samples_per_job"),
                (None, "seed"),
            ):
                spec: dict[str, Any] = {"tenant": "alice", "task": "rl", "base_model": {"id": "x"}}
                if section is None:
                    spec[field] = 2**80
                else:
                    spec[section] = {field: 2**80}
                r = await c.post("/v1/workloads", headers=alice, json=spec)
                assert r.status_code == 422, (field, r.text)
                assert field in r.json()["message"]

            # The scheduler never saw any of it: a good reservation works, one job stored.
            r = await c.post("/v1/scheduler/jobs", headers=alice, json=_JOB)
            assert r.status_code == 201, r.text
            assert len(srv.services.scheduler.list_jobs()) == 1

    run(main)


def test_partition_count_quota_and_global_queue_memory_cap() -> None:
    """Before: one tenant created 3,000 partitions; nothing bounded the whole queue."""

    async def main() -> None:
        async with server(tenants=("bob",), config=ServerConfig(queue_memory_cap_bytes=200)) as srv:
            await srv.add_tenant("alice", TenantQuotas(max_partitions=2))
            for name in ("a", "b"):
                status, body = await srv.msgpack(
                    "POST", f"/v1/queue/partitions/{name}/put", "alice", _put(1, 2)
                )
                assert status == 201, body
            status, body = await srv.msgpack(
                "POST", "/v1/queue/partitions/c/put", "alice", _put(1, 2)
            )
            assert status == 429, body
            assert body["code"] == "quota_exceeded" and body["details"]["reason"] == "partitions"
            assert body["details"]["limit"] == 2 and "partitions" in body["message"]
            # Writing to a partition it owns is fine; clearing one frees a slot.
            status, _ = await srv.msgpack("POST", "/v1/queue/partitions/a/put", "alice", _put(1, 2))
            assert status == 201
            r = await srv.client.delete("/v1/queue/partitions/a", headers=srv.auth("alice"))
            assert r.status_code == 204
            status, _ = await srv.msgpack("POST", "/v1/queue/partitions/c/put", "alice", _put(1, 2))
            assert status == 201

            # The server-wide cap: 200 bytes of all tenants (alice holds 24 now).
            status, _ = await srv.msgpack(
                "POST", "/v1/queue/partitions/bobs/put", "bob", _put(5, 8)
            )  # 160 bytes
            assert status == 201
            status, body = await srv.msgpack(
                "POST", "/v1/queue/partitions/bobs/put", "bob", _put(1, 8)
            )
            assert status == 429 and body["code"] == "memory_cap_exceeded", body
            assert "queue_memory_cap_bytes" in body["message"] and "200" in body["message"]
            assert body["details"]["cap_bytes"] == 200

    run(main)


async def _session(srv: Server, tenant: str) -> str:
    r = await srv.client.post(
        "/v1/env/sessions", headers=srv.auth(tenant), json={"spec": {"kind": "fake"}}
    )
    done = await srv.wait_future(tenant, r.json()["future_id"])
    assert done["state"] == "succeeded", done
    sid: str = done["result"]["session_id"]
    return sid


def test_foreign_ids_answer_like_unknown_ones_and_ids_are_unguessable() -> None:
    """Before: a foreign id answered 403 and an unknown one 404, and session ids were
    sequential (``env-1``, ``env-2``): a tenant could probe for other tenants' ids."""

    async def main() -> None:
        async with server() as srv:
            c, alice, bob = srv.client, srv.auth("alice"), srv.auth("bob")
            mine, theirs = await _session(srv, "alice"), await _session(srv, "bob")
            for sid in (mine, theirs):
                assert re.fullmatch(r"env-[0-9a-f]{24}", sid), sid  # random, no counter
            job = (await c.post("/v1/scheduler/jobs", headers=alice, json=_JOB)).json()
            status, _ = await srv.msgpack(
                "POST", f"/v1/queue/partitions/{job['partition_id']}/put", "alice", _put()
            )
            assert status == 201
            pid, jid = job["partition_id"], job["job_id"]

            pairs = [
                ("POST", f"/v1/env/sessions/{mine}/reset", "/v1/env/sessions/env-9-00/reset"),
                ("DELETE", f"/v1/env/sessions/{mine}", "/v1/env/sessions/env-9-00"),
                ("GET", f"/v1/scheduler/jobs/{jid}", "/v1/scheduler/jobs/job-9-00"),
                ("GET", f"/v1/queue/partitions/{pid}", "/v1/queue/partitions/part-00"),
                ("DELETE", f"/v1/queue/partitions/{pid}", "/v1/queue/partitions/part-00"),
            ]
            for method, foreign, unknown in pairs:
                kw: dict[str, Any] = {"json": {"rollout_id": "r"}} if "reset" in foreign else {}
                a = await c.request(method, foreign, headers=bob, **kw)
                b = await c.request(method, unknown, headers=bob, **kw)
                assert a.status_code == b.status_code and a.status_code in (204, 404), (
                    foreign,
                    a.text,
                    b.text,
                )
                if a.status_code == 404:
                    assert a.json()["code"] == b.json()["code"]
                    assert a.json()["message"].split("'")[0] == b.json()["message"].split("'")[0]
            # bob's probes changed nothing of alice's.
            assert (await c.get(f"/v1/queue/partitions/{pid}", headers=alice)).status_code == 200
            r = await c.post(
                f"/v1/env/sessions/{mine}/reset", headers=alice, json={"rollout_id": "r"}
            )
            assert r.status_code == 200
            # queue_put to another tenant's job partition: as for a made-up derived id.
            a = await srv.msgpack("POST", f"/v1/queue/partitions/{pid}/put", "bob", _put())
            b = await srv.msgpack("POST", "/v1/queue/partitions/part-00/put", "bob", _put())
            assert a[0] == b[0] == 400 and "reserve a job" in a[1]["message"]

    run(main)
