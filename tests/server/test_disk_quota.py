"""The per-tenant disk quota and a full disk over HTTP (issue 43, item 4).

A tenant past ``max_disk_bytes`` is refused (429, reason ``disk_bytes``) when it asks
to write more, and nobody else is; a request whose write finds the disk full answers
``storage_full`` (507), never ``internal_error``, and leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors import SafetensorError

from joynexus.master.service import MasterService
from joynexus.master.store import SQLiteWorkloadStore
from joynexus.server.auth import TenantStore
from joynexus.server.config import TenantQuotas
from joynexus.server.quotas import QUOTA_REASONS
from tests.fakes.plane import (
    FakeProcess,
    custom_spec,
    make_fake_master,
    served_app,
    start_master,
)
from tests.fakes.training import FakeTrainingService

A, B = "alice", "bob"
QUOTA = 64 << 10  # alice's: more than a workload folder, less than her files after a save


@dataclass
class Served:
    process: FakeProcess
    master: MasterService
    client: httpx.AsyncClient
    keys: dict[str, str]

    def run(self, coro: Any) -> Any:
        return self.process.run(coro)

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    async def save(self, tenant: str) -> dict[str, Any]:
        """``POST save`` and the future's final status (or the refusal's body)."""
        r = await self.client.post(f"/v1/models/{tenant}/save", headers=self.auth(tenant), json={})
        if r.status_code != 202:
            return {"http": r.status_code, **r.json()}
        fid = r.json()["future_id"]
        for _ in range(2000):
            f = await self.client.get(f"/v1/futures/{fid}", headers=self.auth(tenant))
            body: dict[str, Any] = f.json()
            if body["state"] != "pending":
                return {"http": 202, **body}
            await asyncio.sleep(0.005)
        raise AssertionError(f"future {fid} did not finish")

    async def submit(self, tenant: str) -> httpx.Response:
        spec = custom_spec(tenant).model_dump(mode="json", by_alias=True, exclude={"output_dir"})
        return await self.client.post("/v1/workloads", headers=self.auth(tenant), json=spec)


async def _setup(tmp_path: Path) -> Served:
    master = await start_master(make_fake_master(tmp_path / "run"))
    tenants = TenantStore.in_memory()
    app = served_app(master, tenants)
    tenants.create_tenant(A, quotas=TenantQuotas(max_disk_bytes=QUOTA))
    tenants.create_tenant(B)
    keys = {t: tenants.create_key(t).api_key for t in (A, B)}
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    return Served(FakeProcess(), master, client, keys)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    process = FakeProcess()
    s = process.run(_setup(tmp_path))
    s.process = process
    try:
        yield s
    finally:

        async def close() -> None:
            await s.client.aclose()
            await s.master.aclose()
            await s.master.inference.stop()

        process.run(close())
        process.shutdown()


def _with_slots(s: Served) -> FakeTrainingService:
    """Both tenants' custom workloads started; the fake training service (its
    checkpoint writer is the seam the tests fill)."""
    for tenant in (A, B):
        r = s.run(s.submit(tenant))
        assert r.status_code == 201, r.text
    s.process.run_until(lambda: {A, B} <= set(s.master.book.tenants), what="both slots")
    training = s.master.training
    assert isinstance(training, FakeTrainingService)
    return training


def test_a_tenant_past_its_disk_quota_gets_429_and_the_other_does_not(served: Served) -> None:
    s = served
    assert "disk_bytes" in QUOTA_REASONS
    training = _with_slots(s)
    training.write_text = lambda path, text: path.write_text(text + " " * QUOTA)
    first = s.run(s.save(A))  # under the quota when asked: written, and past it now
    assert first["state"] == "succeeded", first
    assert s.master.disk.usage(A) > QUOTA
    refused = s.run(s.save(A))
    assert refused["http"] == 429, refused
    assert refused["code"] == "quota_exceeded" and refused["details"]["reason"] == "disk_bytes"
    assert refused["details"]["limit"] == QUOTA and "keep_last" in refused["message"]
    again = s.run(s.submit(A))
    assert again.status_code == 429 and again.json()["details"]["reason"] == "disk_bytes"
    # bob's files are his own: his save and his submit go through.
    assert s.run(s.save(B))["state"] == "succeeded"
    assert s.master.disk.usage(B) > QUOTA  # bigger than alice's quota, not his (64 GiB)
    assert s.run(s.save(B))["state"] == "succeeded"


def test_a_save_that_finds_the_disk_full_answers_storage_full(served: Served) -> None:
    """The finding: another tenant's ``save`` ended ``internal_error``."""
    s = served
    training = _with_slots(s)

    def full(path: Path, text: str) -> object:
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    training.write_text = full
    status = s.run(s.save(B))
    assert status["state"] == "failed", status
    assert status["error"]["code"] == "storage_full", status
    assert "No space left on device" in status["error"]["message"]


def test_a_submit_that_finds_the_store_full_answers_507_and_leaves_nothing(
    served: Served,
) -> None:
    s = served
    store = s.master.store
    assert isinstance(store, SQLiteWorkloadStore)
    real = store._conn
    store._conn = _FullConnection(real)  # type: ignore[assignment]
    r = s.run(s.submit(A))
    assert r.status_code == 507, r.text
    assert r.json()["code"] == "storage_full" and r.headers["Retry-After"]
    assert "database or disk is full" in r.json()["message"]
    assert s.master.reporter.list_workloads(A) == []
    store._conn = real  # space is back
    assert s.run(s.submit(A)).status_code == 201
    assert len(s.master.reporter.list_workloads(A)) == 1


class _FullConnection:
    """A SQLite connection whose writes find the disk full (reads go through)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            raise sqlite3.OperationalError("database or disk is full")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)
