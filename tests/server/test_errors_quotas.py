"""Error bodies, bad bodies and bad tensors (4xx, never 500), and 429 quotas with reasons."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter

from joynexus.errors import JoyNexusError
from joynexus.server import ServerConfig, TenantQuotas
from joynexus.wire import packb
from tests.server.conftest import MSGPACK, run, server

_PUT = "/v1/queue/partitions/mine/put"


def _put_body(arr: Any) -> dict[str, Any]:
    return {"data": {"x": arr}, "metadata": {"schema_signature": "s"}}


def test_bad_bodies_and_bad_tensors_are_clear_4xx() -> None:
    async def main() -> None:
        config = ServerConfig(max_body_bytes=4096, max_tensor_bytes=1024)
        async with server(config=config) as srv:
            c, alice = srv.client, srv.auth("alice")
            mp = {**alice, **MSGPACK}
            good = packb(_put_body(np.zeros((2, 2), np.float32)))
            cases: list[tuple[bytes, dict[str, str], int, str]] = [
                (good[:-5], mp, 400, "not valid msgpack"),
                (b"\x93\x01", mp, 400, "not valid msgpack"),
                (packb([1, 2]), mp, 422, "valid dictionary"),
                (packb(_put_body(np.zeros((300,), np.float32))), mp, 422, "exceeds the limit"),
                (packb(_put_body(np.zeros((2000,), np.float32))), mp, 413, "exceeds the limit"),
                (packb(_put_body(np.array([1, 2], dtype=np.complex64))), mp, 400, "not allowed"),
                (b"{not json", {**alice, "Content-Type": "application/json"}, 400, "JSON"),
                (good, {**alice, "Content-Type": "text/plain"}, 415, "not accepted"),
                (
                    b'{"data": {"x": {"dtype": "float32", "shape": [3], "data": "AAAA"}},'
                    b' "metadata": {"schema_signature": "s"}}',
                    {**alice, "Content-Type": "application/json"},
                    422,
                    "needs 12 bytes",
                ),
                (
                    packb({"data": {"../x": np.zeros(1, np.float32)}, "metadata": {}}),
                    mp,
                    422,
                    "body.data",
                ),
            ]
            for content, headers, status, text in cases:
                r = await c.post(_PUT, content=content, headers=headers)
                assert r.status_code == status, (text, r.text)
                body = r.json()
                assert set(body) == {"code", "message", "details"}
                assert text in body["message"], (text, body)

            # A NaN action, a wrong dtype, a 0-d field, and mismatched puts: all 4xx.
            status, body = await srv.msgpack(
                "POST", "/v1/env/sessions/env-1/step", "alice", {"actions": np.full((1, 2), np.nan)}
            )
            assert status == 400 and "NaN" in body["message"]
            status, body = await srv.msgpack(
                "POST", "/v1/env/sessions/env-1/step", "alice", {"actions": np.zeros((1, 2), int)}
            )
            assert status == 422 and "dtype int64" in body["message"]
            status, body = await srv.msgpack(
                "POST", _PUT, "alice", _put_body(np.zeros((), np.float32))
            )
            assert status == 400 and "0-d" in body["message"], body
            assert (await srv.msgpack("POST", _PUT, "alice", _put_body(np.ones((2, 3)))))[0] == 201
            status, body = await srv.msgpack("POST", _PUT, "alice", _put_body(np.ones((2, 4))))
            assert status == 422 and body["code"] == "schema_mismatch"
            assert body["details"]["expected_shape"] == [-1, 3]

            # Unknown routes, wrong methods, bad path names, bad query values.
            r = await c.get("/v1/nothing-here", headers=alice)
            assert r.status_code == 404 and r.json()["code"] == "not_found"
            r = await c.put("/v1/me", headers=alice)
            assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
            r = await c.get("/v1/queue/partitions/..%2F..%2Fetc", headers=alice)
            assert r.status_code in (404, 422)
            r = await c.get("/v1/futures/f", headers=alice, params={"wait": "soon"})
            assert r.status_code == 422 and r.json()["details"]["errors"][0]["loc"][0] == "query"
            r = await c.post("/v1/queue/partitions/part-guess/put", content=good, headers=mp)
            assert r.status_code == 400 and "reserve a job" in r.json()["message"]

    run(main)


def test_unexpected_exceptions_are_500_with_a_request_id() -> None:
    boom = APIRouter()

    @boom.get("/v1/boom")
    async def explode() -> None:
        raise RuntimeError("secret internals")

    async def main() -> None:
        async with server(extra_routers=[boom], raise_app_exceptions=False) as srv:
            r = await srv.client.get("/v1/boom", headers={"X-Request-ID": "abc123"})
            assert r.status_code == 500
            body = r.json()
            assert body["code"] == "internal_error" and "secret" not in r.text
            assert body["details"]["request_id"] == "abc123" == r.headers["x-request-id"]

    run(main)


def test_every_joynexus_error_maps_to_its_status() -> None:
    raised: list[type[JoyNexusError]] = []

    def walk(cls: type[JoyNexusError]) -> None:
        # The hierarchy of joynexus/errors.py, not the classes Ray derives at run time
        # to re-raise a task's error (an earlier Ray test in this process makes them).
        if cls.__module__.partition(".")[0] == "joynexus":
            raised.append(cls)
        for sub in cls.__subclasses__():
            walk(sub)

    walk(JoyNexusError)
    router = APIRouter()

    @router.get("/v1/raise/{index}")
    async def raise_it(index: int) -> None:
        raise raised[index]("what happened", field="f")

    async def main() -> None:
        async with server(extra_routers=[router], tenants=()) as srv:
            for i, cls in enumerate(raised):
                r = await srv.client.get(f"/v1/raise/{i}")
                assert r.status_code == cls.http_status, cls
                assert r.json() == {
                    "code": cls.code,
                    "message": "what happened",
                    "details": {"field": "f"},
                }

    run(main)


def test_quotas_answer_429_with_a_reason() -> None:
    async def main() -> None:
        tight = TenantQuotas(
            requests_per_s=1.0,
            burst=20,
            max_sessions=0,
            max_inflight_jobs=1,
            max_queue_bytes=64,
        )
        async with server(tenants=()) as srv:
            await srv.add_tenant("alice", tight)
            c, alice = srv.client, srv.auth("alice")

            r = await c.post("/v1/env/sessions", headers=alice, json={"spec": {"kind": "fake"}})
            assert r.status_code == 429 and r.json()["details"]["reason"] == "sessions"
            job = {
                "policy_key": "p",
                "domain": "d",
                "task_type": "sft",
                "sample_count": 1,
                "producer_role": "a",
                "consumer_role": "b",
            }
            assert (await c.post("/v1/scheduler/jobs", headers=alice, json=job)).status_code == 201
            r = await c.post("/v1/scheduler/jobs", headers=alice, json=job)
            assert r.status_code == 429 and r.json()["details"]["reason"] == "inflight_jobs"
            assert r.json()["details"]["limit"] == 1
            status, body = await srv.msgpack(
                "POST", _PUT, "alice", _put_body(np.zeros((3, 8), np.float32))
            )
            assert status == 429 and body["details"]["reason"] == "queue_bytes", body
            status, _ = await srv.msgpack(
                "POST", _PUT, "alice", _put_body(np.zeros((2, 8), np.float32))
            )
            assert status == 201  # 64 bytes: exactly at the quota

            # The bucket started with 20 tokens; the calls above spent 5 of them.
            for _ in range(15):
                assert (await c.get("/v1/me", headers=alice)).status_code == 200
            r = await c.get("/v1/me", headers=alice)
            assert r.status_code == 429 and r.json()["details"]["reason"] == "rate_limit"
            assert r.headers["retry-after"] == "1"
            srv.clock.advance(1.0)  # one token back at 1 request/s
            assert (await c.get("/v1/me", headers=alice)).status_code == 200
            assert (await c.get("/v1/me", headers=alice)).status_code == 429

    run(main)


def test_scheduler_admission_refusal_is_429() -> None:
    from joynexus.control.admission import AdmissionPolicy

    async def main() -> None:
        async with server() as srv:
            srv.services.scheduler.set_policy("alice", "sft", AdmissionPolicy(max_in_flight=0))
            r = await srv.client.post(
                "/v1/scheduler/jobs",
                headers=srv.auth("alice"),
                json={
                    "policy_key": "p",
                    "domain": "d",
                    "task_type": "sft",
                    "sample_count": 1,
                    "producer_role": "a",
                    "consumer_role": "b",
                },
            )
            assert r.status_code == 429
            assert r.json()["details"]["reason"].startswith("admission:")

    run(main)
