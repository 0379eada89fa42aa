"""The tenant gateway's one rule, route by route (issue 22): on every route that takes
an id — job, workload, session, partition, future, artifact, model slot, and the job
ids the futures of ``rollout`` and ``train_job`` reach — another tenant's id and a
never-issued id get the same status, the same error code and the same message and
details once the id itself is taken out. A route that told them apart would be an
oracle for which ids exist.

The server runs a Master on the fake plane (no model), set up once for the module in
an event loop of its own; bob's probes change nothing of alice's, so the cases share it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from joynexus.envs.base import EnvSpec
from joynexus.errors import unknown_id
from joynexus.master.service import MasterService
from joynexus.server.auth import TenantStore
from joynexus.wire import packb
from tests.fakes.plane import (
    FakeProcess,
    custom_spec,
    make_fake_master,
    served_app,
    start_master,
)
from tests.server.conftest import MSGPACK

_JOB = {
    "policy_key": "p",
    "domain": "d",
    "task_type": "rl",
    "sample_count": 1,
    "producer_role": "prod",
    "consumer_role": "cons",
}
_PUT = {"data": {"x": np.zeros((2, 3), np.float32)}, "metadata": {"schema_signature": "s"}}


@dataclass
class Ids:
    """Alice's ids (the foreign ones, to bob) and never-issued ids of the same form."""

    job: str
    partition: str
    session: str
    future: str
    workload: str
    slot: str


UNKNOWN = Ids(
    job="job-9-0000000000000000",
    partition="part-0000000000000000",
    session="env-9-0000000000000000",
    future="fut-0000000000000000",
    workload="wl-9-00000000",
    slot="zed",
)


@dataclass
class Probe:
    """One request: ``path`` and ``body`` built from an :class:`Ids`; ``status`` is
    what both answers must be (so the test cannot pass on two identical 422s)."""

    method: str
    path: Callable[[Ids], str]
    status: int
    json: Callable[[Ids], Any] | None = None
    msgpack: Any = None
    #: The id the answer names (taken out before the messages are compared).
    named: Callable[[Ids], str] | None = None
    #: The message says the id (every "unknown id" answer does).
    says_id: bool = True


def _job(route: str, json: Any) -> Probe:
    return Probe(
        "POST",
        lambda i: f"/v1/scheduler/jobs/{i.job}/{route}",
        404,
        json=lambda _: json,
        named=lambda i: i.job,
    )


def _part(method: str, route: str, json: Any = None, msgpack: Any = None) -> Probe:
    return Probe(
        method,
        lambda i: f"/v1/queue/partitions/{i.partition}{route}",
        404,
        json=(lambda _: json) if json is not None else None,
        msgpack=msgpack,
        named=lambda i: i.partition,
    )


def _workload(method: str, route: str) -> Probe:
    return Probe(
        method, lambda i: f"/v1/workloads/{i.workload}{route}", 404, named=lambda i: i.workload
    )


PROBES: dict[str, Probe] = {
    "job.get": Probe("GET", lambda i: f"/v1/scheduler/jobs/{i.job}", 404, named=lambda i: i.job),
    "job.mark": _job("mark", {"state": "ready", "lease_epoch": 1}),
    "job.hand_off": _job("hand_off", {"lease_epoch": 1}),
    "job.heartbeat": _job("heartbeat", {"lease_epoch": 1}),
    "job.complete": _job("complete", {"metadata": {"a": 1}}),
    "job.fail": _job("fail", {"reason": "r"}),
    "job.drop": _job("drop", {"reason": "r"}),
    "partition.info": _part("GET", ""),
    "partition.get_meta": _part(
        "POST", "/get_meta", {"fields": ["x"], "batch_size": 1, "task_name": "t"}
    ),
    "partition.get_data": _part("POST", "/get_data", {"indexes": [0], "fields": ["x"]}),
    "partition.put_fields": _part(
        "POST", "/put_fields", msgpack={"indexes": [0], "data": {"y": np.zeros(1, np.float32)}}
    ),
    # A no-op for an unknown partition, and so for another tenant's.
    "partition.clear": Probe("DELETE", lambda i: f"/v1/queue/partitions/{i.partition}", 204),
    # Scheduler-derived names are the scheduler's to give: refused alike (400).
    "partition.put": Probe(
        "POST",
        lambda i: f"/v1/queue/partitions/{i.partition}/put",
        400,
        msgpack=_PUT,
        named=lambda i: i.partition,
        says_id=False,
    ),
    "session.reset": Probe(
        "POST",
        lambda i: f"/v1/env/sessions/{i.session}/reset",
        404,
        lambda _: {"rollout_id": "r"},
        named=lambda i: i.session,
    ),
    "session.step": Probe(
        "POST",
        lambda i: f"/v1/env/sessions/{i.session}/step",
        404,
        msgpack={"actions": np.zeros((1, 2), np.float32)},
        named=lambda i: i.session,
    ),
    "session.close": Probe(
        "DELETE", lambda i: f"/v1/env/sessions/{i.session}", 404, named=lambda i: i.session
    ),
    "future.get": Probe("GET", lambda i: f"/v1/futures/{i.future}", 404, named=lambda i: i.future),
    "future.delete": Probe(
        "DELETE", lambda i: f"/v1/futures/{i.future}", 404, named=lambda i: i.future
    ),
    "workload.get": _workload("GET", ""),
    "workload.status": _workload("GET", "/status"),
    "workload.metrics": _workload("GET", "/metrics"),
    "workload.pause": _workload("POST", "/pause"),
    "workload.resume": _workload("POST", "/resume"),
    "workload.cancel": _workload("POST", "/cancel"),
    "artifact.list": _workload("GET", "/artifacts"),
    "artifact.get": Probe(
        "GET",
        lambda i: f"/v1/workloads/{i.workload}/artifacts/workloads/{i.workload}/workload.json",
        404,
        named=lambda i: i.workload,
    ),
    # The model slot in the path: any name but the caller's is the same 403.
    "slot.export": Probe(
        "GET", lambda i: f"/v1/models/{i.slot}/export", 403, named=lambda i: i.slot
    ),
    "slot.predict": Probe(
        "POST",
        lambda i: f"/v1/models/{i.slot}/predict",
        403,
        msgpack={
            "observations": {
                "cameras": {"top": np.zeros((1, 8, 8, 3), np.uint8)},
                "state": np.zeros((1, 2), np.float32),
                "instructions": ["reach"],
            }
        },
        named=lambda i: i.slot,
    ),
}


@dataclass
class Harness:
    client: httpx.AsyncClient
    keys: dict[str, str]
    ids: Ids

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    async def send(self, probe: Probe, ids: Ids, tenant: str = "bob") -> httpx.Response:
        headers = self.auth(tenant)
        content = None
        if probe.msgpack is not None:
            headers = {**headers, **MSGPACK}
            content = packb(probe.msgpack)
        return await self.client.request(
            probe.method,
            probe.path(ids),
            headers=headers,
            json=None if probe.json is None else probe.json(ids),
            content=content,
        )

    async def wait_future(self, tenant: str, future_id: str) -> dict[str, Any]:
        for _ in range(2000):
            r = await self.client.get(f"/v1/futures/{future_id}", headers=self.auth(tenant))
            assert r.status_code == 200, r.text
            status: dict[str, Any] = r.json()
            if status["state"] != "pending":
                return status
            await asyncio.sleep(0.005)
        raise AssertionError(f"future {future_id} did not finish")


async def _setup(tmp_path: Path) -> tuple[Harness, MasterService]:
    master = await start_master(make_fake_master(tmp_path / "run"))
    tenants = TenantStore.in_memory()
    app = served_app(master, tenants)
    keys = {}
    for tenant in ("alice", "bob"):
        tenants.create_tenant(tenant)
        keys[tenant] = tenants.create_key(tenant).api_key
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    h = Harness(client, keys, UNKNOWN)
    # alice holds one id of every kind; bob has a model slot of his own.
    wl = await master.lifecycle.submit(custom_spec("alice"), "alice")
    await master.lifecycle.submit(custom_spec("bob"), "bob")
    job = await client.post("/v1/scheduler/jobs", headers=h.auth("alice"), json=_JOB)
    assert job.status_code == 201, job.text
    pid = job.json()["partition_id"]
    r = await client.post(
        f"/v1/queue/partitions/{pid}/put",
        headers={**h.auth("alice"), **MSGPACK},
        content=packb(_PUT),
    )
    assert r.status_code == 201, r.text
    session = await master.env.create_session(
        "alice", EnvSpec.model_validate({"kind": "reach2d", "num_envs": 1})
    )
    for _ in range(2000):  # both slots exist once the custom workloads run
        if {"alice", "bob"} <= set(master.book.tenants):
            break
        await asyncio.sleep(0.005)
    r = await client.post("/v1/models/alice/save", headers=h.auth("alice"), json={})
    assert r.status_code == 202, r.text
    h.ids = Ids(
        job=job.json()["job_id"],
        partition=pid,
        session=session.session_id,
        future=r.json()["future_id"],
        workload=wl.workload_id,
        slot="alice",
    )
    return h, master


async def _teardown(h: Harness, master: MasterService) -> None:
    await h.client.aclose()
    await master.aclose()
    await master.inference.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeProcess, Harness]]:
    process = FakeProcess()
    h, master = process.run(_setup(tmp_path_factory.mktemp("gateway")))
    try:
        yield process, h
    finally:
        process.run(_teardown(h, master))
        process.shutdown()


def _shape(body: dict[str, Any], named: str | None) -> dict[str, Any]:
    """The answer with the id it names taken out (the one thing allowed to differ)."""
    if named is None:
        return body
    text = str(body).replace(repr(named), "<id>").replace(named, "<id>")
    return {"text": text}


def _same(a: httpx.Response, b: httpx.Response, probe: Probe, h: Harness) -> None:
    assert a.status_code == b.status_code == probe.status, (a.text, b.text)
    if probe.status == 204:
        return
    ja, jb = a.json(), b.json()
    assert ja["code"] == jb["code"], (ja, jb)
    named_a = probe.named(h.ids) if probe.named else None
    named_b = probe.named(UNKNOWN) if probe.named else None
    assert _shape(ja, named_a) == _shape(jb, named_b), (ja, jb)
    if named_a is not None and probe.says_id:
        assert named_a in ja["message"], ja  # the message names the id it was asked


def test_alice_reaches_her_own_ids(served: tuple[FakeProcess, Harness]) -> None:
    """The probes below are not vacuous: the ids are alice's and answer her."""
    process, h = served

    async def main() -> None:
        for name in ("job.get", "partition.info", "future.get", "workload.status"):
            r = await h.send(PROBES[name], h.ids, tenant="alice")
            assert r.status_code == 200, (name, r.text)
        r = await h.send(PROBES["session.reset"], h.ids, tenant="alice")
        assert r.status_code == 200, r.text

    process.run(main())


@pytest.mark.parametrize("name", sorted(PROBES))
def test_foreign_id_answers_exactly_as_a_never_issued_one(
    served: tuple[FakeProcess, Harness], name: str
) -> None:
    process, h = served
    probe = PROBES[name]

    async def main() -> None:
        foreign = await h.send(probe, h.ids)
        unknown = await h.send(probe, UNKNOWN)
        _same(foreign, unknown, probe, h)

    process.run(main())


@pytest.mark.parametrize("route", ["rollout", "train_job"])
def test_futures_of_rollout_and_train_job_are_no_oracle(
    served: tuple[FakeProcess, Harness], route: str
) -> None:
    """Before: bob's ``rollout`` on alice's job failed its future with ``no job 'x'``
    (``not_found``), on a made-up id with ``no training job 'x'`` (``job_not_found``)."""
    process, h = served

    async def main() -> None:
        errors = []
        for job_id in (h.ids.job, UNKNOWN.job):
            body: dict[str, Any] = {"job_id": job_id}
            if route == "rollout":
                body |= {"session_id": "s", "num_envs": 1, "horizon": 1}
            r = await h.client.post(f"/v1/models/bob/{route}", headers=h.auth("bob"), json=body)
            assert r.status_code == 202, r.text
            status = await h.wait_future("bob", r.json()["future_id"])
            assert status["state"] == "failed", status
            errors.append(_shape(status["error"], job_id))
        assert errors[0] == errors[1]
        expected = unknown_id("job", UNKNOWN.job)
        assert f"'{expected.code}'" in errors[1]["text"], errors

    process.run(main())
