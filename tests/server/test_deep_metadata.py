"""Free-form JSON nested past what an answer can carry (issue 43).

Before: a job whose metadata nested 300 levels (1.8 KB) answered 500 *after* it was
stored, and from then on its tenant's ``GET /v1/scheduler/jobs`` answered 500, across
restarts (pydantic refuses to serialize past a fixed depth).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from joynexus.control.store import WITHHELD_METADATA_KEY, withheld_metadata
from joynexus.utils.jsondepth import MAX_JSON_DEPTH
from tests.server.conftest import run, server

_JOB = {
    "policy_key": "p",
    "domain": "d",
    "task_type": "sft",
    "sample_count": 1,
    "producer_role": "prod",
    "consumer_role": "cons",
}


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_deep_metadata_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    async def main() -> None:
        async with server(scheduler_path=tmp_path / "scheduler.sqlite") as srv:
            c, alice = srv.client, srv.auth("alice")
            deep = {**_JOB, "metadata": _nested(300)}
            assert len(json.dumps(deep)) < 4096  # small: the size limits do not catch it
            r = await c.post("/v1/scheduler/jobs", headers=alice, json=deep)
            assert r.status_code == 422, r.text
            message = r.json()["message"]
            assert "body.metadata" in message and f"more than {MAX_JSON_DEPTH} levels" in message
            assert srv.services.scheduler.list_jobs("alice") == []  # nothing stored
            r = await c.get("/v1/scheduler/jobs", headers=alice)
            assert r.status_code == 200 and r.json() == []

            # Lists count as levels too; the limit itself passes.
            r = await c.post(
                "/v1/scheduler/jobs", headers=alice, json={**_JOB, "metadata": {"l": [[[[1]]]]}}
            )
            assert r.status_code == 201, r.text
            at_limit = {**_JOB, "metadata": _nested(MAX_JSON_DEPTH)}
            r = await c.post("/v1/scheduler/jobs", headers=alice, json=at_limit)
            assert r.status_code == 201, r.text
            job = r.json()

            # A complete whose metadata nests too deep leaves the job as it was.
            jid = job["job_id"]
            r = await c.post(
                f"/v1/scheduler/jobs/{jid}/mark", headers=alice, json={"state": "ready"}
            )
            assert r.status_code == 200, r.text
            lease = {"consumer_role": "cons", "domains": ["d"]}
            leased = (await c.post("/v1/scheduler/lease", headers=alice, json=lease)).json()["job"]
            assert leased["job_id"] == jid
            done = {"lease_epoch": leased["lease_epoch"], "metadata": {"x": _nested(40)}}
            r = await c.post(f"/v1/scheduler/jobs/{jid}/complete", headers=alice, json=done)
            assert r.status_code == 422 and "body.metadata" in r.json()["message"], r.text
            r = await c.get(f"/v1/scheduler/jobs/{jid}", headers=alice)
            assert r.status_code == 200 and r.json()["state"] == "leased"
            assert r.json()["metadata"] == _nested(MAX_JSON_DEPTH)
            r = await c.get("/v1/scheduler/jobs", headers=alice)
            assert r.status_code == 200 and len(r.json()) == 2

    run(main)


def test_deep_env_options_are_refused() -> None:
    async def main() -> None:
        async with server() as srv:
            spec = {"kind": "reach2d", "options": {"o": _nested(300)}}
            r = await srv.client.post(
                "/v1/env/sessions", headers=srv.auth("alice"), json={"spec": spec}
            )
            assert r.status_code == 422, r.text
            assert "body.spec.options" in r.json()["message"]
            assert f"more than {MAX_JSON_DEPTH} levels" in r.json()["message"]

    run(main)


def test_a_job_stored_with_deep_metadata_by_an_older_version_still_lists(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An older version stored 300-level metadata; its tenant's listing must not break."""
    path = tmp_path / "scheduler.sqlite"

    async def store_jobs() -> str:
        async with server(scheduler_path=path) as srv:
            c, alice = srv.client, srv.auth("alice")
            for meta in ({"keep": "me"}, {"deep": "soon"}):
                r = await c.post(
                    "/v1/scheduler/jobs", headers=alice, json={**_JOB, "metadata": meta}
                )
                assert r.status_code == 201, r.text
            return str(r.json()["job_id"])

    async def list_jobs(deep_id: str) -> None:
        async with server(scheduler_path=path) as srv:
            c, alice = srv.client, srv.auth("alice")
            r = await c.get("/v1/scheduler/jobs", headers=alice)
            assert r.status_code == 200, r.text
            metadata = {j["job_id"]: j["metadata"] for j in r.json()}
            assert metadata[deep_id] == withheld_metadata()
            assert {"keep": "me"} in metadata.values()
            r = await c.get(f"/v1/scheduler/jobs/{deep_id}", headers=alice)
            assert r.status_code == 200 and WITHHELD_METADATA_KEY in r.json()["metadata"]
            # The job still moves through its lifecycle.
            r = await c.post(
                f"/v1/scheduler/jobs/{deep_id}/fail", headers=alice, json={"reason": "old"}
            )
            assert r.status_code == 200 and r.json()["state"] == "failed", r.text

    deep_id = asyncio.run(store_jobs())
    with sqlite3.connect(path) as conn:  # what the older version wrote
        conn.execute(
            "UPDATE jobs SET metadata = ? WHERE job_id = ?",
            (json.dumps(_nested(300), sort_keys=True), deep_id),
        )
    with caplog.at_level(logging.WARNING, logger="joynexus.control.store"):
        run(lambda: list_jobs(deep_id))
    assert any(deep_id in r.getMessage() and "32 levels" in r.getMessage() for r in caplog.records)
    with sqlite3.connect(path) as conn:  # the row keeps what was stored
        (text,) = conn.execute("SELECT metadata FROM jobs WHERE job_id = ?", (deep_id,)).fetchone()
    assert json.loads(text) == _nested(300)
