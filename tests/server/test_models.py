"""Model primitives over HTTP (paper Figure 4) on the caller's own slot."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from joynexus.wire import MSGPACK_MEDIA_TYPE, packb, unpackb
from tests.server.livesrv import Live, live, reach_custom

MSGPACK = {"Content-Type": MSGPACK_MEDIA_TYPE, "Accept": MSGPACK_MEDIA_TYPE}


def _obs(n: int, *, actions: bool = False) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {
        "cameras": {"top": rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8)},
        "state": rng.normal(size=(n, 4)).astype(np.float32),
        "instructions": ["reach"] * n,
    }
    if actions:
        out["actions"] = rng.normal(size=(n, 1, 2)).astype(np.float32)
    return out


async def _post(lv: Live, tenant: str, op: str, body: Any, owner: str | None = None) -> Any:
    r = await lv.client.post(
        f"/v1/models/{owner or tenant}/{op}",
        content=packb(body),
        headers={**MSGPACK, **lv.auth(tenant)},
    )
    if r.headers.get("content-type", "").startswith(MSGPACK_MEDIA_TYPE):
        return r.status_code, unpackb(r.content)
    return r.status_code, r.json()


def test_primitives_on_a_custom_slot(tmp_path: Path, tiny_model: str) -> None:
    async def main() -> None:
        async with live(tmp_path, tiny_model) as lv:
            code, body = await _post(lv, "alice", "predict", {"observations": _obs(2)})
            assert code == 404 and "custom" in body["message"]  # no slot before a workload
            r = await lv.submit("alice", reach_custom("alice", tiny_model))
            await lv.wait_state("alice", r.json()["workload_id"], ["running"])

            code, pred = await _post(
                lv, "alice", "predict", {"observations": _obs(3), "mode": "sample"}
            )
            assert code == 200, pred
            assert pred["actions"].shape == (3, 1, 2) and pred["log_probs"].shape == (3,)
            assert pred["policy_version"] == 0

            # Bad tensors: 4xx naming the problem, never a 5xx.
            nan = _obs(2)
            nan["state"][0, 0] = np.nan
            bad_shape = _obs(2)
            bad_shape["cameras"]["top"] = np.zeros((2, 8, 8, 3), np.uint8)
            wrong_dtype = _obs(2)
            wrong_dtype["cameras"]["top"] = np.zeros((2, 32, 32, 3), np.float32)
            for obs, word in ((nan, "state"), (bad_shape, "top"), (wrong_dtype, "top")):
                code, body = await _post(lv, "alice", "predict", {"observations": obs})
                assert code == 422 and word in body["message"], body

            # Another tenant's slot: 403 whatever the body.
            code, body = await _post(lv, "bob", "predict", {"observations": _obs(1)}, "alice")
            assert code == 403 and body["code"] == "permission_denied"

            adv = np.ones(4, np.float32)
            step_body = {"observations": _obs(4, actions=True), "loss": "reinforce"}
            code, body = await _post(lv, "alice", "train_batch", step_body)
            assert code == 400 and "advantages" in body["message"]
            code, step = await _post(lv, "alice", "train_batch", {**step_body, "advantages": adv})
            assert code == 200 and step["policy_version"] == 1, step

            code, params = await _post(lv, "alice", "export_params", {})
            assert code == 200 and params["policy_version"] == 1
            named = params["named_tensors"]
            assert named and not any(k.startswith("base") for k in named)
            bad = {k: np.zeros((1,), np.float32) for k in named}
            code, body = await _post(
                lv, "alice", "load_weights", {"version": 1, "named_tensors": bad}
            )
            assert code in (400, 422), body
            code, body = await _post(
                lv, "alice", "load_weights", {"version": 1, "named_tensors": named}
            )
            assert code == 200 and body["policy_version"] == 1
            _, pred = await _post(lv, "alice", "predict", {"observations": _obs(1)})
            assert pred["policy_version"] == 1

            r = await lv.client.post(
                "/v1/models/alice/save", json={"include_optim": False}, headers=lv.auth("alice")
            )
            assert r.status_code == 202
            fid = r.json()["future_id"]
            r = await lv.client.get(f"/v1/futures/{fid}?wait=30", headers=lv.auth("alice"))
            paths = r.json()["result"]["paths"]
            assert paths == ["step_1"], r.json()

            r = await lv.client.get("/v1/models/alice/export", headers=lv.auth("alice"))
            doc = r.json()
            assert doc["manifest"]["schema_signature"] == params["schema_signature"]
            assert set(doc["named_tensors"]) == set(named)

    asyncio.run(main())


def test_rollout_and_train_job_over_scheduler_primitives(tmp_path: Path, tiny_model: str) -> None:
    async def main() -> None:
        async with live(tmp_path, tiny_model) as lv:
            c, h = lv.client, lv.auth("alice")
            r = await lv.submit("alice", reach_custom("alice", tiny_model))
            st = await lv.wait_state("alice", r.json()["workload_id"], ["running"])
            r = await c.post(
                "/v1/env/sessions",
                headers=h,
                json={"spec": {"kind": "reach2d", "num_envs": 2, "image_size": 32}},
            )
            done = await c.get(f"/v1/futures/{r.json()['future_id']}?wait=30", headers=h)
            session = done.json()["result"]["session_id"]
            job = (
                await c.post(
                    "/v1/scheduler/jobs",
                    headers=h,
                    json={
                        "policy_key": "mine",
                        "domain": "custom",
                        "task_type": "rl",
                        "sample_count": 8,
                        "producer_role": "roll",
                        "consumer_role": "learn",
                        "behavior_policy_version": 0,
                        "metadata": {"schema_signature": st["schema_signature"]},
                    },
                )
            ).json()
            body = {"job_id": job["job_id"], "session_id": session, "num_envs": 2, "horizon": 4}
            r = await c.post("/v1/models/alice/rollout", json=body, headers=h)
            assert r.status_code == 202, r.text
            res = await c.get(f"/v1/futures/{r.json()['future_id']}?wait=60", headers=h)
            assert res.json()["state"] == "succeeded", res.json()
            assert res.json()["result"]["num_samples"] == 8
            part = job["partition_id"]
            # The tenant computes advantages itself (here: rewards), then trains the job.
            meta = (
                await c.post(
                    f"/v1/queue/partitions/{part}/get_meta",
                    headers=h,
                    json={"fields": ["rewards"], "batch_size": 8, "task_name": "adv"},
                )
            ).json()
            adv = np.linspace(-1, 1, 8).astype(np.float32)
            r = await c.post(
                f"/v1/queue/partitions/{part}/put_fields",
                content=packb(
                    {"indexes": meta["indexes"], "data": {"advantages": adv, "returns": adv}}
                ),
                headers={**MSGPACK, **h},
            )
            assert r.status_code == 204, r.text
            jid = job["job_id"]
            r = await c.post(
                f"/v1/scheduler/jobs/{jid}/mark",
                json={"state": "needs_advantages", "lease_epoch": job["lease_epoch"]},
                headers=h,
            )
            assert r.status_code == 200, r.text
            r = await c.post(
                "/v1/scheduler/lease_stage",
                json={
                    "state": "needs_advantages",
                    "leased_state": "computing_advantages",
                    "consumer_role": "learn",
                    "domain": "custom",
                },
                headers=h,
            )
            staged = r.json()["job"]
            assert staged is not None and staged["job_id"] == jid, r.text
            r = await c.post(
                f"/v1/scheduler/jobs/{jid}/mark",
                json={"state": "ready", "lease_epoch": staged["lease_epoch"]},
                headers=h,
            )
            assert r.status_code == 200, r.text
            r = await c.post(
                "/v1/scheduler/lease",
                json={"consumer_role": "learn", "domains": ["custom"]},
                headers=h,
            )
            assert r.status_code == 200 and r.json()["job"]["job_id"] == jid, r.text
            r = await c.post(
                "/v1/models/alice/train_job", json={"job_id": job["job_id"]}, headers=h
            )
            res = await c.get(f"/v1/futures/{r.json()['future_id']}?wait=60", headers=h)
            assert res.json()["state"] == "succeeded", res.json()
            assert res.json()["result"]["policy_version"] >= 1

            # Bob cannot drive Alice's job even through his own slot path.
            r = await c.post(
                "/v1/models/bob/train_job", json={"job_id": job["job_id"]}, headers=lv.auth("bob")
            )
            assert r.status_code == 404  # bob has no slot

    asyncio.run(main())


def test_non_finite_and_misshapen_primitives_are_refused(tmp_path: Path, tiny_model: str) -> None:
    async def main() -> None:
        async with live(tmp_path, tiny_model) as lv:
            r = await lv.submit("alice", reach_custom("alice", tiny_model))
            await lv.wait_state("alice", r.json()["workload_id"], ["running"])

            # NaN weights are refused, naming the tensor; the served version stays.
            code, params = await _post(lv, "alice", "export_params", {})
            named = dict(params["named_tensors"])
            name = sorted(named)[0]
            named[name] = np.full_like(named[name], np.nan)
            code, body = await _post(
                lv, "alice", "load_weights", {"version": 1, "named_tensors": named}
            )
            assert code in (400, 422) and f"named_tensors['{name}']" in body["message"], body
            code, pred = await _post(lv, "alice", "predict", {"observations": _obs(1)})
            assert code == 200 and pred["policy_version"] == 0

            # Non-finite observations are refused at the boundary ...
            inf = _obs(1)
            inf["state"][0, 1] = np.inf
            code, body = await _post(lv, "alice", "predict", {"observations": inf})
            assert code == 422 and "observations.state" in body["message"], body
            # ... and finite but huge ones that overflow answer an error, never NaN actions.
            huge = _obs(1)
            huge["state"][:] = 3e38
            code, body = await _post(lv, "alice", "predict", {"observations": huge})
            assert code == 400 and "NaN or infinite actions" in body["message"], body

            # PPO advantages of shape [7] for a batch of 1: 422, no optimizer step.
            step = {
                "observations": _obs(1, actions=True),
                "loss": "ppo",
                "advantages": np.ones(7, np.float32),
                "old_log_probs": np.zeros(1, np.float32),
            }
            code, body = await _post(lv, "alice", "train_batch", step)
            assert code == 422 and body["details"]["field"] == "advantages", body
            assert "[1]" in body["message"] and "[7]" in body["message"]
            pad = {
                **step,
                "advantages": np.ones(1, np.float32),
                "action_is_pad": np.zeros((2, 1), bool),
            }
            code, body = await _post(lv, "alice", "train_batch", pad)
            assert code == 422 and body["details"]["field"] == "action_is_pad", body
            code, params = await _post(lv, "alice", "export_params", {})
            assert params["policy_version"] == 0  # never stepped

    asyncio.run(main())
