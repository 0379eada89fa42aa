"""Workload routes over a live Master: validation, ownership, pause/resume, cancel, artifacts."""

from __future__ import annotations

import asyncio
from pathlib import Path

from joynexus.control.job import JobState
from joynexus.master.limits import MasterLimits
from tests.server.livesrv import (
    live,
    reach_custom,
    reach_rl,
)


def test_bad_specs_are_422_with_the_offending_fields(tmp_path: Path, tiny_model: str) -> None:
    async def main() -> None:
        async with live(tmp_path, tiny_model, limits=MasterLimits(max_horizon=64)) as lv:
            bad_shape = {**reach_rl("alice", tiny_model), "bogus": 1}
            bad_shape["algorithm"] = {"name": "ppo", "horizon": -3}
            r = await lv.submit("alice", bad_shape)
            assert r.status_code == 422, r.text
            locs = {tuple(e["loc"]) for e in r.json()["details"]["errors"]}
            assert ("body", "bogus") in locs and ("body", "algorithm", "horizon") in locs

            unknown_env = reach_rl("alice", tiny_model)
            unknown_env["env"] = {"kind": "no-such-sim"}
            r = await lv.submit("alice", unknown_env)
            assert r.status_code == 422 and "reach2d" in r.json()["message"], r.text

            limits = reach_rl("alice", "some/other-model", horizon=500)
            limits["env"]["num_envs"] = 999
            r = await lv.submit("alice", limits)
            body = r.json()
            assert r.status_code == 422 and body["code"] == "invalid_spec", r.text
            assert set(body["details"]["fields"]) == {
                "base_model.id",
                "algorithm.horizon",
                "env.num_envs",
            }
            assert tiny_model in body["message"]  # the allowed base model is listed

            denied = reach_rl("alice", tiny_model)
            denied["env"] = {"kind": "remote", "options": {"url": "http://x"}}
            r = await lv.submit("alice", denied)
            assert r.status_code == 422 and r.json()["details"]["fields"] == ["env.kind"]

            sft = {
                "tenant": "alice",
                "task": "sft",
                "base_model": {"id": tiny_model},
                "dataset": {"path": "/etc"},
            }
            r = await lv.submit("alice", sft)
            assert r.status_code == 422 and "dataset.path" in r.json()["details"]["fields"]

            many_cams = reach_custom("alice", tiny_model)
            del many_cams["env"]
            cams = {f"c{i}": {"height": 32, "width": 32} for i in range(9)}
            many_cams["schema"] = {"name": "x", "cameras": cams, "state_dim": 1, "action_dim": 2}
            r = await lv.submit("alice", many_cams)
            assert r.status_code == 422 and "camera slots" in r.json()["message"], r.text

            r = await lv.submit("alice", reach_rl("bob", tiny_model))
            assert r.status_code == 403 and r.json()["code"] == "permission_denied"
            r = await lv.client.get("/v1/workloads", headers=lv.auth("alice"))
            assert r.json() == []  # nothing was started

    asyncio.run(main())


def test_pause_resume_and_cancel_release_everything(tmp_path: Path, tiny_model: str) -> None:
    async def main() -> None:
        async with live(tmp_path, tiny_model) as lv:
            master = lv.srv.master
            sched, queue, env = master.scheduler, master.queue, master.env
            r = await lv.submit("alice", reach_rl("alice", tiny_model, target=50))
            assert r.status_code == 201, r.text
            wid = r.json()["workload_id"]
            st = await lv.wait_state("alice", wid, ["running"])
            assert st["session_id"] and st["schema_signature"]

            # Another tenant cannot see or steer it: to bob it does not exist.
            for path in ("status", "metrics", "artifacts"):
                r = await lv.client.get(f"/v1/workloads/{wid}/{path}", headers=lv.auth("bob"))
                assert r.status_code == 404 and r.json()["code"] == "not_found", r.text
            r = await lv.client.post(f"/v1/workloads/{wid}/cancel", headers=lv.auth("bob"))
            assert r.status_code == 404

            r = await lv.client.post(f"/v1/workloads/{wid}/resume", headers=lv.auth("alice"))
            assert r.status_code == 409  # not paused
            r = await lv.client.post(f"/v1/workloads/{wid}/pause", headers=lv.auth("alice"))
            assert r.status_code == 200 and r.json()["state"] == "paused"
            # Once the jobs in flight drain, a paused workload reserves nothing new.
            for _ in range(2000):
                if not any(not j.is_terminal for j in sched.list_jobs(tenant_id="alice")):
                    break
                await asyncio.sleep(0.02)
            created = len(sched.list_jobs(tenant_id="alice"))
            assert sched.last_refusal("alice", "rl") == "max_in_flight"
            await asyncio.sleep(0.3)
            assert len(sched.list_jobs(tenant_id="alice")) == created

            r = await lv.client.post(f"/v1/workloads/{wid}/resume", headers=lv.auth("alice"))
            assert r.status_code == 200 and r.json()["state"] == "running"
            for _ in range(2000):
                if len(sched.list_jobs(tenant_id="alice")) > created:
                    break
                await asyncio.sleep(0.02)
            assert len(sched.list_jobs(tenant_id="alice")) > created
            # Let a job reach the queue so cancel has a partition to release.
            for _ in range(2000):
                jobs = sched.list_jobs(tenant_id="alice")
                if any(queue.has_partition(j.partition_id) for j in jobs if not j.is_terminal):
                    break
                await asyncio.sleep(0.01)
            assert await env.list_sessions("alice")

            r = await lv.client.post(f"/v1/workloads/{wid}/cancel", headers=lv.auth("alice"))
            assert r.status_code == 200 and r.json()["state"] == "cancelled"
            jobs = sched.list_jobs(tenant_id="alice")
            assert all(j.is_terminal for j in jobs)
            assert any(
                j.state is JobState.FAILED and j.terminal_reason == "cancelled" for j in jobs
            )
            assert await env.list_sessions("alice") == []
            mine = {j.partition_id for j in jobs}
            assert not [p for p in queue.partitions() if p.partition_id in mine]
            assert "alice" not in master.training.tenant_ids()
            assert "alice" not in master.inference.states.tenant_ids()
            r = await lv.client.post("/v1/models/alice/export_params", headers=lv.auth("alice"))
            assert r.status_code == 404  # the slot is gone

            # A new workload may start afterwards (and resumes from the checkpoint, if any).
            r = await lv.submit("alice", reach_custom("alice", tiny_model))
            assert r.status_code == 201, r.text
            second = r.json()["workload_id"]
            await lv.wait_state("alice", second, ["running"])
            r = await lv.submit("alice", reach_custom("alice", tiny_model))
            assert r.status_code == 409  # one trainable workload per tenant

    asyncio.run(main())


def test_artifacts_stay_inside_the_tenant_dir(tmp_path: Path, tiny_model: str) -> None:
    async def main() -> None:
        async with live(tmp_path, tiny_model) as lv:
            r = await lv.submit("alice", reach_custom("alice", tiny_model))
            wid = r.json()["workload_id"]
            await lv.wait_state("alice", wid, ["running"])
            (tmp_path / "outputs" / "bob").mkdir(parents=True)
            (tmp_path / "outputs" / "bob" / "secret.txt").write_text("bob's")
            (tmp_path / "outputs" / "alice" / "link").symlink_to(tmp_path / "outputs" / "bob")

            r = await lv.client.get(f"/v1/workloads/{wid}/artifacts", headers=lv.auth("alice"))
            paths = [a["path"] for a in r.json()]
            assert f"workloads/{wid}/workload.json" in paths
            assert not any("secret" in p for p in paths)
            url = f"/v1/workloads/{wid}/artifacts/workloads/{wid}/workload.json"
            r = await lv.client.get(url, headers=lv.auth("alice"))
            assert r.status_code == 200 and r.json()["tenant_id"] == "alice"

            base = f"/v1/workloads/{wid}/artifacts/"
            for evil, code in (
                ("%2e%2e/bob/secret.txt", 400),
                ("..%2Fbob%2Fsecret.txt", 400),
                ("link/secret.txt", 403),
                ("nope.txt", 404),
            ):
                r = await lv.client.get(base + evil, headers=lv.auth("alice"))
                assert r.status_code == code, (evil, r.status_code, r.text)
                assert "bob's" not in r.text

    asyncio.run(main())


def test_an_admin_key_is_told_what_submitting_needs(tmp_path: Path, tiny_model: str) -> None:
    """Regression: an admin submitting for a tenant that does not exist was told "this
    endpoint acts as a tenant"; a tenant with no policy evaluating itself was told it
    "is not a trainable tenant of this run; trainable tenants: []"."""

    async def main() -> None:
        async with live(tmp_path, tiny_model, tenants=("alice",)) as lv:
            admin = {"Authorization": f"Bearer {lv.admin_key}"}
            r = await lv.client.post(
                "/v1/workloads", json=reach_custom("ghost", tiny_model), headers=admin
            )
            assert r.status_code == 404, r.text
            message = r.json()["message"]
            assert "tenant 'ghost' does not exist" in message
            assert "`joynexus tenants create ghost`" in message

            r = await lv.client.post(
                "/v1/workloads", json=reach_custom("alice", tiny_model), headers=admin
            )
            assert r.status_code == 403, r.text
            assert "submit with 'alice''s API key" in r.json()["message"]

            own_eval = {
                "tenant": "alice",
                "task": "eval",
                "base_model": {"id": tiny_model},
                "env": {"kind": "reach2d", "num_envs": 2, "image_size": 32},
                "evaluation": {"targets": ["alice"]},
            }
            r = await lv.submit("alice", own_eval)
            assert r.status_code == 422, r.text
            message = r.json()["message"]
            assert "tenant 'alice' has no policy to evaluate yet" in message
            assert "trainable tenants: []" not in message

    asyncio.run(main())
