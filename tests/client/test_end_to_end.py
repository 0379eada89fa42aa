"""Proof: two tenants' workloads through the HTTP API while a third runs a custom algorithm.

A real uvicorn server (127.0.0.1, ephemeral port) hosts one Master over one set of
services with a tiny backbone. Alice runs reach2d RL and Bob reach2d SFT (declared
workloads, submitted and followed with the sync client) while Carol runs
``examples/custom_reinforce.py`` (environment session + predict + train_batch) from
another thread, all at the same time.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from joynexus.client import Client, WorkloadStatus
from joynexus.master.limits import MasterLimits
from joynexus.wire import unpackb
from tests.server.livesrv import (
    make_live,
    reach_rl,
    reach_sft,
    tenant_dataset_root,
    uvicorn_thread,
)

ROOT = Path(__file__).resolve().parents[2]


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "custom_reinforce", ROOT / "examples" / "custom_reinforce.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_reinforce"] = module
    spec.loader.exec_module(module)
    return module


def test_two_workloads_and_a_custom_algorithm_share_one_server(
    tmp_path: Path, tiny_model: str, reach_demos: Path
) -> None:
    root = tenant_dataset_root(tmp_path / "datasets", reach_demos, "bob")
    limits = MasterLimits(dataset_roots=[root])
    srv = make_live(tmp_path / "run", tiny_model, limits=limits)
    admin_key = srv.tenants.create_admin_key().api_key
    example = _example()
    with uvicorn_thread(srv.app) as url:
        with Client(url, admin_key) as admin:
            keys = {t: admin.create_tenant(t)["api_key"] for t in ("alice", "bob", "carol")}
            assert {t["tenant_id"] for t in admin.list_tenants()} == {"alice", "bob", "carol"}

        custom: dict[str, Any] = {}

        def carol() -> None:
            try:
                with Client(url, keys["carol"]) as c:
                    custom["report"] = example.run(
                        c, "carol", tiny_model, iterations=3, num_envs=2, horizon=6
                    )
            except BaseException as exc:  # surfaced by the main thread's assertion
                custom["error"] = exc

        thread = threading.Thread(target=carol)
        with Client(url, keys["alice"]) as alice, Client(url, keys["bob"]) as bob:
            rl = alice.submit(reach_rl("alice", tiny_model, target=2))
            sft = bob.submit(reach_sft("bob", tiny_model, Path(reach_demos.name), target=2))
            thread.start()
            seen: list[WorkloadStatus] = []
            done_rl = alice.wait(rl.workload_id, poll_s=0.1, timeout_s=300, on_progress=seen.append)
            done_sft = bob.wait(sft.workload_id, poll_s=0.1, timeout_s=300)
            thread.join(timeout=300)

            assert "error" not in custom, custom.get("error")
            for st in (done_rl, done_sft):
                assert st.state.value == "completed", st
                assert st.jobs_completed >= 2 and st.jobs_target == 2
                assert st.policy_version is not None and st.policy_version >= 2
                assert st.jobs_failed == 0
            assert any(s.state.value == "running" for s in seen)

            report = custom["report"]
            assert len(report.iterations) == 3
            versions = [it.policy_version for it in report.iterations]
            assert versions == [1, 2, 3]  # one train_batch step per iteration
            assert [it.served_version for it in report.iterations] == versions
            assert alice.status(rl.workload_id).state.value == "completed"

            # Artifacts: checkpoints and metrics of Alice's own output dir.
            files = {a["path"] for a in alice.artifacts(rl.workload_id)}
            ckpt = f"step_{done_rl.policy_version}/manifest.json"
            assert ckpt in files and f"workloads/{rl.workload_id}/metrics.jsonl" in files
            assert b"alice" in alice.download(rl.workload_id, ckpt)
            metrics = alice.metrics(rl.workload_id, kind="train")
            assert len(metrics.records) >= 2 and metrics.summary["rollout"]["count"] >= 2

            # Export of the action module: msgpack manifest + named tensors.
            exported = unpackb(bob.export("bob"))
            assert exported["manifest"]["tenant_id"] == "bob"
            assert exported["manifest"]["policy_version"] == done_sft.policy_version
            assert exported["named_tensors"]

        with Client(url, keys["carol"]) as c:
            statuses = c.list_workloads()
            # The example leaves its workload running: carol keeps serving what it trained.
            assert [s.state.value for s in statuses] == ["running"]
            assert statuses[0].policy_version == custom["report"].iterations[-1].policy_version
            assert c.list_sessions() == []
