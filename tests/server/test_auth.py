"""Tenants, API keys and the auth matrix: every endpoint × {own, other tenant, none, bad}."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joynexus.errors import ConflictError, InvalidRequestError
from joynexus.server import TenantStore
from joynexus.wire import packb
from tests.server.conftest import MSGPACK, Server, run, server

BAD_KEY = "jnx_0123456789abcdef_not-the-secret"


def test_keys_are_hashed_at_rest_and_survive_a_reopen(tmp_path: Path) -> None:
    db = tmp_path / "run" / "tenants.sqlite"
    store = TenantStore.open(db)
    store.create_tenant("alice")
    issued = store.create_key("alice", label="laptop")
    admin = store.create_admin_key()
    store.close()
    raw = db.read_bytes()
    secret = issued.api_key.split("_", 2)[2]
    assert secret.encode() not in raw and issued.api_key.encode() not in raw
    rows = sqlite3.connect(db).execute("SELECT length(salt), length(digest) FROM api_keys")
    assert all(salt == 16 and digest == 32 for salt, digest in rows)

    store = TenantStore.open(db)
    principal = store.authenticate(issued.api_key)
    assert principal is not None and principal.tenant_id == "alice"
    assert principal.role == "tenant"
    assert store.authenticate(admin.api_key) is not None
    assert store.authenticate(issued.api_key[:-1] + "x") is None
    assert store.authenticate("jnx_" + issued.record.key_id) is None
    store.revoke_key(issued.record.key_id)
    assert store.authenticate(issued.api_key) is None
    assert [k.revoked for k in store.list_keys("alice")] == [True]


def test_a_verified_key_and_a_tenant_are_answered_without_a_query() -> None:
    """Per request the hub authenticates and reads the tenant's quotas: once verified,
    neither asks the database again, and a revocation still answers the next request."""
    store = TenantStore.in_memory()
    store.create_tenant("alice")
    issued = store.create_key("alice")
    first = store.authenticate(issued.api_key)
    assert first is not None and store.get_tenant("alice").tenant_id == "alice"
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    for _ in range(3):
        assert store.authenticate(issued.api_key) == first
        assert store.get_tenant("alice").quotas is None
    assert store.authenticate(issued.api_key[:-1] + "x") is None  # wrong secret, same id
    assert statements == []
    store.revoke_key(issued.record.key_id)
    assert store.authenticate(issued.api_key) is None
    assert statements  # the revoked key went back to the database


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", ".hidden", "x" * 65, "tab\tname"])
def test_tenant_ids_are_validated(bad: str) -> None:
    store = TenantStore.in_memory()
    with pytest.raises(InvalidRequestError, match="tenant id"):
        store.create_tenant(bad)


def test_duplicate_tenant_is_a_conflict() -> None:
    store = TenantStore.in_memory()
    store.create_tenant("alice")
    with pytest.raises(ConflictError):
        store.create_tenant("alice")


def test_admin_endpoints_and_key_revocation_over_http() -> None:
    async def main() -> None:
        async with server(tenants=("alice",)) as srv:
            c = srv.client
            r = await c.post("/v1/tenants", json={"tenant_id": "../bob"}, headers=srv.admin)
            assert r.status_code == 422 and r.json()["code"] == "invalid_request"
            assert r.json()["details"]["errors"][0]["loc"] == ["body", "tenant_id"]
            r = await c.post("/v1/tenants", json={"tenant_id": "alice"}, headers=srv.admin)
            assert r.status_code == 409
            r = await c.post("/v1/tenants/alice/keys", json={"label": "ci"}, headers=srv.admin)
            assert r.status_code == 201
            second = r.json()
            r = await c.get("/v1/me", headers={"Authorization": f"Bearer {second['api_key']}"})
            assert r.status_code == 200 and r.json()["tenant_id"] == "alice"
            r = await c.delete(
                f"/v1/tenants/alice/keys/{second['key']['key_id']}", headers=srv.admin
            )
            assert r.status_code == 204
            r = await c.get("/v1/me", headers={"Authorization": f"Bearer {second['api_key']}"})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            r = await c.get("/v1/tenants/alice/keys", headers=srv.admin)
            assert [k["revoked"] for k in r.json()] == [False, True]
            assert all("api_key" not in k for k in r.json())

    run(main)


async def _resources(srv: Server) -> dict[str, str]:
    """Alice's session, future, partition, job and key: the objects the matrix aims at."""
    c, alice = srv.client, srv.auth("alice")
    r = await c.post(
        "/v1/env/sessions", headers=alice, json={"spec": {"kind": "fake", "image_size": 4}}
    )
    future_id = r.json()["future_id"]
    done = await srv.wait_future("alice", future_id)
    assert done["state"] == "succeeded", done
    job = (
        await c.post(
            "/v1/scheduler/jobs",
            headers=alice,
            json={
                "policy_key": "p",
                "domain": "d",
                "task_type": "sft",
                "sample_count": 2,
                "producer_role": "prod",
                "consumer_role": "cons",
            },
        )
    ).json()
    status, _ = await srv.msgpack(
        "POST",
        f"/v1/queue/partitions/{job['partition_id']}/put",
        "alice",
        {"data": {"x": np.zeros((2, 3), np.float32)}, "metadata": {"schema_signature": "s"}},
    )
    assert status == 201
    spare = (await c.post("/v1/tenants/alice/keys", json={}, headers=srv.admin)).json()
    return {
        "session_id": done["result"]["session_id"],
        "future_id": future_id,
        "partition_id": job["partition_id"],
        "job_id": job["job_id"],
        "key_id": spare["key"]["key_id"],  # revoked by the matrix, so not alice's main key
        "tenant_id": "alice",
    }


_JOB_BODY = {
    "policy_key": "p",
    "domain": "d",
    "task_type": "sft",
    "sample_count": 1,
    "producer_role": "prod",
    "consumer_role": "cons",
}
# (method, path) -> (body kind, body). Body kind: json | msgpack | none.
_REQUESTS: dict[tuple[str, str], tuple[str, Any]] = {
    ("GET", "/v1/me"): ("none", None),
    ("POST", "/v1/tenants"): ("json", {"tenant_id": "zed"}),
    ("GET", "/v1/tenants"): ("none", None),
    ("GET", "/v1/tenants/{tenant_id}/keys"): ("none", None),
    ("POST", "/v1/tenants/{tenant_id}/keys"): ("json", {}),
    ("DELETE", "/v1/tenants/{tenant_id}/keys/{key_id}"): ("none", None),
    ("GET", "/v1/futures"): ("none", None),
    ("GET", "/v1/futures/{future_id}"): ("none", None),
    ("DELETE", "/v1/futures/{future_id}"): ("none", None),
    ("POST", "/v1/env/sessions"): ("json", {"spec": {"kind": "nope"}}),
    ("GET", "/v1/env/sessions"): ("none", None),
    ("POST", "/v1/env/sessions/{session_id}/reset"): ("json", {"rollout_id": "r"}),
    ("POST", "/v1/env/sessions/{session_id}/step"): (
        "msgpack",
        {"actions": np.zeros((1, 2), np.float32)},
    ),
    ("DELETE", "/v1/env/sessions/{session_id}"): ("none", None),
    ("GET", "/v1/queue/partitions"): ("none", None),
    ("GET", "/v1/queue/partitions/{partition_id}"): ("none", None),
    ("POST", "/v1/queue/partitions/{partition_id}/put"): (
        "msgpack",
        {"data": {"x": np.zeros((1, 3), np.float32)}, "metadata": {"schema_signature": "s"}},
    ),
    ("POST", "/v1/queue/partitions/{partition_id}/get_meta"): (
        "json",
        {"fields": ["x"], "batch_size": 1, "task_name": "t"},
    ),
    ("POST", "/v1/queue/partitions/{partition_id}/get_data"): (
        "json",
        {"indexes": [0], "fields": ["x"]},
    ),
    ("POST", "/v1/queue/partitions/{partition_id}/put_fields"): (
        "msgpack",
        {"indexes": [0], "data": {"adv": np.zeros(1, np.float32)}},
    ),
    ("DELETE", "/v1/queue/partitions/{partition_id}"): ("none", None),
    ("POST", "/v1/scheduler/jobs"): ("json", _JOB_BODY),
    ("GET", "/v1/scheduler/jobs"): ("none", None),
    ("GET", "/v1/scheduler/jobs/{job_id}"): ("none", None),
    ("POST", "/v1/scheduler/jobs/{job_id}/mark"): ("json", {"state": "ready"}),
    ("POST", "/v1/scheduler/jobs/{job_id}/hand_off"): ("json", {}),
    ("POST", "/v1/scheduler/jobs/{job_id}/heartbeat"): ("json", {"lease_epoch": 1}),
    ("POST", "/v1/scheduler/jobs/{job_id}/complete"): ("json", {}),
    ("POST", "/v1/scheduler/jobs/{job_id}/fail"): ("json", {"reason": "test"}),
    ("POST", "/v1/scheduler/jobs/{job_id}/drop"): ("json", {"reason": "test"}),
    ("POST", "/v1/scheduler/lease"): ("json", {"consumer_role": "cons", "domains": ["d"]}),
    ("POST", "/v1/scheduler/lease_stage"): (
        "json",
        {
            "state": "needs_advantages",
            "leased_state": "computing_advantages",
            "consumer_role": "c",
            "domain": "d",
        },
    ),
}
# Ids of the same shapes as alice's that exist nowhere.
_UNKNOWN = {
    "session_id": "env-999-0123456789abcdef",
    "future_id": "fut-999-0123456789ab",
    "partition_id": "part-0123456789abcdef01234567",
    "job_id": "job-999-0123456789ab",
    "workload_id": "wl-999-01234567",
}


def _masked(body: Any, ids: dict[str, str]) -> Any:
    """``body`` with every id of ``ids`` replaced by its name (to compare two answers)."""
    text = json.dumps(body, sort_keys=True)
    for name, value in ids.items():
        if name in _UNKNOWN:
            text = text.replace(value, f"<{name}>")
    return json.loads(text)


# Destructive calls go last so the others still find alice's objects.
_LAST = ("DELETE", "fail", "drop", "complete")


def _order(item: tuple[str, str]) -> int:
    method, path = item
    # Cancelling a workload closes the tenant's sessions: after everything else.
    return int(method == "DELETE" or path.endswith(_LAST[1:])) + 2 * path.endswith("/cancel")


def test_auth_matrix_covers_every_endpoint() -> None:
    async def main() -> None:
        async with server(tenants=("alice", "bob")) as srv:
            await auth_matrix(srv, _REQUESTS, await _resources(srv))

    run(main)


async def auth_matrix(
    srv: Server, requests: dict[tuple[str, str], tuple[str, Any]], ids: dict[str, str]
) -> None:
    """Every ``/v1`` route of the live OpenAPI document × {own, other, none, bad} keys.

    ``requests`` must list exactly the document's routes; ``ids`` fills their paths
    with alice's objects. Also used by the workload/model route tests (live Master).
    """
    routes = {
        (method.upper(), path)
        for path, item in srv.app.openapi()["paths"].items()
        if path.startswith("/v1")
        for method in item
    }
    assert routes == set(requests), routes ^ set(requests)
    for method, template in sorted(requests, key=_order):
        kind, body = requests[(method, template)]
        url = template.format(**ids)
        admin_only = template.startswith(("/v1/tenants", "/v1/admin"))
        scoped = "{" in template and not admin_only

        async def call(
            key: str | None,
            url: str = url,
            kind: str = kind,
            method: str = method,
            body: Any = body,
        ) -> Any:
            headers = {} if key is None else {"Authorization": f"Bearer {key}"}
            if kind == "msgpack":
                headers.update(MSGPACK)
                return await srv.client.request(method, url, content=packb(body), headers=headers)
            if kind == "json":
                return await srv.client.request(method, url, json=body, headers=headers)
            return await srv.client.request(method, url, headers=headers)

        where = f"{method} {template}"
        for key in (None, BAD_KEY, "jnx_short", "Basic abc"):
            r = await call(key)
            assert r.status_code == 401, (where, key, r.text)
            assert r.json()["code"] == "unauthenticated"
        own = srv.admin_key if admin_only else srv.keys["alice"]
        other = srv.keys["bob"]
        r = await call(other)
        if admin_only or template.startswith("/v1/models/{tenant_id}"):
            # Not an oracle: any other tenant's slot (or an admin route) answers 403.
            assert r.status_code == 403, (where, r.text)
            assert r.json()["code"] == "permission_denied"
        elif scoped:
            # No existence oracle: alice's object answers bob exactly as an unknown one.
            unknown_ids = {**ids, **_UNKNOWN}
            unknown_ids["path"] = ids.get("path", "").replace(
                ids.get("workload_id", "-"), _UNKNOWN["workload_id"]
            )
            u = await call(other, url=template.format(**unknown_ids))
            assert r.status_code == u.status_code and r.status_code != 403, (where, r, u)
            if r.content or u.content:
                assert _masked(r.json(), ids) == _masked(u.json(), unknown_ids), where
        else:
            assert r.status_code < 300 or r.status_code in (404, 409, 422), (where, r.text)
            assert ids["job_id"] not in r.text and ids["session_id"] not in r.text
        if admin_only:
            r = await call(srv.keys["alice"])  # a tenant key is not an admin key
            assert r.status_code == 403, (where, r.text)
        r = await call(own)
        assert r.status_code not in (401, 403) and r.status_code < 500, (where, r.text)
