"""``joynexus status`` piped: whole ids, whatever the width.

Regression: into a pipe rich assumed 80 columns and cut the workload ids with an
ellipsis, so an id pasted from ``joynexus status | cat`` into another command got 404.
"""

from __future__ import annotations

import time

import httpx
import pytest
from typer.testing import CliRunner

from joynexus.api import WorkloadState, WorkloadStatus
from joynexus.cli import workloads
from joynexus.cli.main import app
from joynexus.client import Client

IDS = [f"wl-{i:02d}-0123456789abcdef0123456789abcdef" for i in range(2)]


def _fake_server(request: httpx.Request) -> httpx.Response:
    assert request.url.path == "/v1/workloads"
    rows = [
        WorkloadStatus(
            workload_id=wid,
            tenant_id="reach-ppo",
            task="rl",
            state=WorkloadState.RUNNING,
            created_at=time.time(),
            jobs_completed=3,
            jobs_target=40,
            policy_version=3,
            error="a long reason that would take the table past eighty columns " * 2,
        ).model_dump(mode="json")
        for wid in IDS
    ]
    return httpx.Response(200, json=rows)


def test_piped_status_prints_whole_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    def client(url: str | None, key: str | None) -> Client:
        return Client("http://jnx", "k", transport=httpx.MockTransport(_fake_server))

    monkeypatch.setattr(workloads, "_client", client)
    # CliRunner's output is no terminal, as a pipe; 80 columns is rich's default there.
    out = CliRunner().invoke(app, ["status"], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].split("\t") == list(workloads.COLUMNS)
    assert [line.split("\t")[0] for line in lines[1:]] == IDS  # whole, pasteable
    assert all(line.split("\t")[2] == "running" for line in lines[1:])
