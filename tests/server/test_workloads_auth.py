"""The auth matrix over a live server: the base routes plus the workload and model routes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from joynexus.utils.clock import FakeClock
from tests.server.conftest import Server
from tests.server.livesrv import live, reach_custom
from tests.server.test_auth import _REQUESTS, _resources, auth_matrix


def _obs(n: int) -> dict[str, Any]:
    return {
        "cameras": {"top": np.zeros((n, 32, 32, 3), np.uint8)},
        "state": np.zeros((n, 4), np.float32),
        "instructions": ["reach"] * n,
    }


_WORKLOAD = "/v1/workloads/{workload_id}"
_MODEL = "/v1/models/{tenant_id}"
MORE: dict[tuple[str, str], tuple[str, Any]] = {
    ("POST", "/v1/workloads"): ("json", {"tenant": "alice"}),
    ("GET", "/v1/workloads"): ("none", None),
    ("GET", _WORKLOAD): ("none", None),
    ("GET", _WORKLOAD + "/status"): ("none", None),
    ("GET", _WORKLOAD + "/metrics"): ("none", None),
    ("GET", _WORKLOAD + "/artifacts"): ("none", None),
    ("GET", _WORKLOAD + "/artifacts/{path}"): ("none", None),
    ("POST", _WORKLOAD + "/pause"): ("none", None),
    ("POST", _WORKLOAD + "/resume"): ("none", None),
    ("POST", _MODEL + "/predict"): ("msgpack", {"observations": _obs(1)}),
    (
        "POST",
        _MODEL + "/train_batch",
    ): (
        "msgpack",
        {
            "observations": {**_obs(2), "actions": np.zeros((2, 1, 2), np.float32)},
            "loss": "reinforce",
            "advantages": np.ones(2, np.float32),
        },
    ),
    ("POST", _MODEL + "/export_params"): ("none", None),
    ("POST", _MODEL + "/load_weights"): (
        "msgpack",
        {"version": 5, "named_tensors": {"x": np.zeros(1, np.float32)}},
    ),
    ("POST", _MODEL + "/save"): ("json", {}),
    ("POST", _MODEL + "/rollout"): (
        "json",
        {"job_id": "nope", "session_id": "s", "num_envs": 1, "horizon": 1},
    ),
    ("POST", _MODEL + "/train_job"): ("json", {"job_id": "nope"}),
    ("GET", _MODEL + "/export"): ("none", None),
    # Usage and dashboard views: a tenant key sees only its own tenant (no other's ids).
    ("GET", "/v1/usage"): ("none", None),
    ("GET", "/v1/dashboard/state"): ("none", None),
    ("POST", _WORKLOAD + "/cancel"): ("none", None),
    ("GET", "/v1/admin/engines"): ("none", None),
    ("POST", "/v1/admin/engines"): ("json", {"engines": 1}),
}


def test_auth_matrix_with_workload_and_model_routes(tmp_path: Path, tiny_model: str) -> None:
    async def main() -> None:
        async with live(tmp_path, tiny_model) as lv:
            srv = Server(
                lv.srv.app, lv.client, FakeClock(), lv.srv.app.state.joynexus.services, lv.admin_key
            )
            srv.keys.update(lv.keys)
            ids = await _resources(srv)
            r = await lv.submit("alice", reach_custom("alice", tiny_model))
            wid = r.json()["workload_id"]
            await lv.wait_state("alice", wid, ["running"])
            ids.update(workload_id=wid, path=f"workloads/{wid}/workload.json")
            await auth_matrix(srv, {**_REQUESTS, **MORE}, ids)

    asyncio.run(main())
