"""A full disk under the Master (issue 28, item 8).

The fake training service writes its checkpoints through a file-writer seam; the test
makes it raise ``OSError(ENOSPC)`` (never fills a real disk). A failed checkpoint must
roll the slot back to its last checkpoint (never train ahead of what is saved and
served), show the fault on the workload, not count against it, and the workload must
recover by itself once writes succeed again. Over HTTP a full disk answers 507 with
the reason, not a 500.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient

from joynexus.api import WorkloadState
from joynexus.control.job import JobState, TaskType
from joynexus.control.scheduler import TrainingScheduler
from joynexus.queues.training import TrainingQueue
from joynexus.server.app import create_app
from joynexus.server.auth import TenantStore
from joynexus.server.state import ServiceRegistry
from joynexus.services.environment import EnvironmentService
from joynexus.workflows.context import STORAGE_FULL_REASON
from tests.fakes.plane import FakeServer, checkpointed_state, rl_spec

A = "alice"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeServer]:
    srv = FakeServer(tmp_path / "run")  # default job-failure budget: 5
    yield srv
    srv.close()


def _enospc(path: Path, text: str) -> object:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_a_full_disk_rolls_back_shows_the_fault_and_recovers_by_itself(
    server: FakeServer,
) -> None:
    m, training, inference = server.master, server.plane.training, server.plane.inference
    wid = server.run(m.lifecycle.submit(rl_spec(A, target=100_000), A)).workload_id

    def jobs(state: JobState) -> list[str]:
        return [
            j.job_id
            for j in server.plane.scheduler.list_jobs(tenant_id=A, state=state)
            if j.metadata.get("workload_id") == wid
        ]

    def storage_failures() -> int:
        return sum(
            1
            for j in server.plane.scheduler.list_jobs(tenant_id=A, state=JobState.FAILED)
            if j.terminal_reason == STORAGE_FULL_REASON
        )

    server.run_until(lambda: len(jobs(JobState.COMPLETED)) >= 2, what="two jobs completed")
    training.write_text = _enospc  # the disk is full from now on
    # More failed saves than the workload's failure budget (5): none counts against it.
    server.run_until(lambda: storage_failures() >= 8, what="saves failing")
    st = m.reporter.status(A, wid)
    assert st.state is WorkloadState.RUNNING, st
    assert st.fault is not None and "checkpoint writes fail" in st.fault, st
    assert "No space left on device" in st.fault
    # Never ahead of the last checkpoint, which is what inference serves.
    ck = checkpointed_state(server.plane.output_root, A)
    assert ck is not None
    server.run_until(
        lambda: training.policy_version(A) == ck["version"], what="slot at its checkpoint"
    )
    assert inference.current_policy_version(A) == ck["version"]
    assert not any(p.name.endswith(".tmp") for p in (server.plane.output_root / A).iterdir())

    training.write_text = Path.write_text  # space is freed
    freed = time.monotonic()
    completed = len(jobs(JobState.COMPLETED))
    server.run_until(
        lambda: len(jobs(JobState.COMPLETED)) >= completed + 3, what="training resumed"
    )
    recovery_s = time.monotonic() - freed
    st = m.reporter.status(A, wid)
    assert st.state is WorkloadState.RUNNING and st.fault is None, st
    assert jobs(JobState.DROPPED) == [], "jobs were dropped policy_stale"
    print(f"disk-full recovery: 3 jobs completed {recovery_s * 1000:.0f} ms after space returned")
    # The durability contract holds across the fault: the checkpoint holds exactly the
    # completed jobs' updates.
    server.run(m.lifecycle.pause(A, wid))
    server.run_until(lambda: m.reporter.status(A, wid).jobs_in_flight == 0, what="drained")
    ck = checkpointed_state(server.plane.output_root, A)
    assert ck is not None
    done = [
        j.job_id
        for j in server.plane.scheduler.list_jobs(tenant_id=A, state=JobState.COMPLETED)
        if j.task_type is TaskType.RL
    ]
    assert sorted(ck["applied"]) == sorted(done)


def test_a_full_disk_answers_507_with_the_reason() -> None:
    router = APIRouter()

    @router.post("/v1/write")
    async def write() -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/run/outputs/x")

    services = ServiceRegistry(
        tenants=TenantStore.in_memory(),
        scheduler=TrainingScheduler.in_memory(),
        training_queue=TrainingQueue(),
        environment=EnvironmentService(),
    )
    app = create_app(services=services, extra_routers=(router,))
    client = TestClient(app, raise_server_exceptions=False)
    response = client.post("/v1/write")
    assert response.status_code == 507, response.text
    body = response.json()
    assert body["code"] == "storage_full" and "disk is full" in body["message"]
