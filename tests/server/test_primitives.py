"""Figure 4 primitives over HTTP: a custom algorithm loop, and env sessions on PushT."""

from __future__ import annotations

import numpy as np
import pytest

from joynexus.wire import tensor_to_json
from tests.server.conftest import run, server


def test_custom_algorithm_loop_reserve_put_mark_lease_get_complete() -> None:
    async def main() -> None:
        async with server() as srv:
            c, alice = srv.client, srv.auth("alice")
            r = await c.post(
                "/v1/scheduler/jobs",
                headers=alice,
                json={
                    "policy_key": "alice-policy",
                    "domain": "custom",
                    "task_type": "sft",
                    "sample_count": 6,
                    "producer_role": "producer",
                    "consumer_role": "learner",
                    "metadata": {"schema_signature": "sig-1"},
                },
            )
            assert r.status_code == 201, r.text
            job = r.json()
            assert job["state"] == "reserved" and job["lease_epoch"] == 1
            assert job["tenant_id"] == "alice" and job["consumer_role"] == "learner"
            pid = job["partition_id"]

            obs = np.arange(6 * 4 * 4 * 3, dtype=np.uint8).reshape(6, 4, 4, 3)
            actions = np.linspace(-1, 1, 12, dtype=np.float32).reshape(6, 1, 2)
            text = np.array(["push the block"] * 6).astype("<U256")
            status, put = await srv.msgpack(
                "POST",
                f"/v1/queue/partitions/{pid}/put",
                "alice",
                {
                    "data": {"obs.cam": obs, "actions": actions, "instruction": text},
                    "metadata": {"schema_signature": "sig-1"},
                },
            )
            assert status == 201, put
            assert put["indexes"] == list(range(6))

            r = await c.post(
                f"/v1/scheduler/jobs/{job['job_id']}/mark",
                headers=alice,
                json={"state": "ready", "lease_epoch": 1},
            )
            assert r.status_code == 200 and r.json()["state"] == "ready", r.text
            # bob's consumer of the same role name sees nothing: roles are per tenant.
            await srv.add_tenant("carol")
            lease_body = {"consumer_role": "learner", "domains": ["custom"]}
            r = await c.post("/v1/scheduler/lease", headers=srv.auth("bob"), json=lease_body)
            assert r.status_code == 200 and r.json() == {"job": None}
            r = await c.post("/v1/scheduler/lease", headers=alice, json=lease_body)
            leased = r.json()["job"]
            assert leased["job_id"] == job["job_id"] and leased["state"] == "leased"

            seen: list[np.ndarray] = []
            while True:
                r = await c.post(
                    f"/v1/queue/partitions/{pid}/get_meta",
                    headers=alice,
                    json={"fields": ["actions", "instruction"], "batch_size": 4, "task_name": "t"},
                )
                assert r.status_code == 200, r.text
                meta = r.json()
                if not meta["indexes"]:
                    break
                assert all(m["tenant_id"] == "alice" for m in meta["sample_meta"])
                status, data = await srv.msgpack(
                    "POST",
                    f"/v1/queue/partitions/{pid}/get_data",
                    "alice",
                    json={"indexes": meta["indexes"], "fields": meta["fields"]},
                )
                assert status == 200
                assert data["data"]["instruction"][0] == "push the block"
                seen.append(data["data"]["actions"])
                # A derived field, written back against the same samples (JSON this time).
                adv = np.ones(len(meta["indexes"]), np.float32)
                r = await c.post(
                    f"/v1/queue/partitions/{pid}/put_fields",
                    headers={**alice, "Content-Type": "application/json"},
                    json={
                        "indexes": meta["indexes"],
                        "data": {"advantages": _json_tensor(adv)},
                    },
                )
                assert r.status_code == 204, r.text
            np.testing.assert_array_equal(np.concatenate(seen), actions)

            r = await c.post(
                f"/v1/queue/partitions/{pid}/get_data",
                headers=alice,
                json={"indexes": [0, 5], "fields": ["advantages"]},
            )
            assert r.status_code == 200
            assert r.json()["data"]["advantages"]["shape"] == [2]

            r = await c.post(
                f"/v1/scheduler/jobs/{job['job_id']}/complete",
                headers=alice,
                json={"lease_epoch": leased["lease_epoch"], "metadata": {"loss": 0.5}},
            )
            assert r.status_code == 200 and r.json()["state"] == "completed"
            assert r.json()["metadata"]["loss"] == 0.5
            r = await c.delete(f"/v1/queue/partitions/{pid}", headers=alice)
            assert r.status_code == 204
            r = await c.get(f"/v1/queue/partitions/{pid}", headers=alice)
            assert r.status_code == 404 and r.json()["code"] == "partition_not_found"
            r = await c.get("/v1/scheduler/jobs", headers=alice, params={"state": "completed"})
            assert [j["job_id"] for j in r.json()] == [job["job_id"]]

    run(main)


def _json_tensor(arr: np.ndarray) -> dict[str, object]:
    return tensor_to_json(arr)


def test_illegal_transition_and_stale_lease_are_409() -> None:
    async def main() -> None:
        async with server() as srv:
            c, alice = srv.client, srv.auth("alice")
            body = {
                "policy_key": "p",
                "domain": "d",
                "task_type": "rl",
                "sample_count": 1,
                "producer_role": "prod",
                "consumer_role": "cons",
            }
            job = (await c.post("/v1/scheduler/jobs", headers=alice, json=body)).json()
            r = await c.post(
                f"/v1/scheduler/jobs/{job['job_id']}/mark", headers=alice, json={"state": "ready"}
            )
            assert r.status_code == 409 and r.json()["code"] == "illegal_transition"
            assert "needs_advantages" in r.json()["message"]
            r = await c.post(
                f"/v1/scheduler/jobs/{job['job_id']}/heartbeat",
                headers=alice,
                json={"lease_epoch": 7},
            )
            assert r.status_code == 409 and r.json()["code"] == "stale_lease"
            r = await c.get("/v1/scheduler/jobs/job-404", headers=alice)
            assert r.status_code == 404 and r.json()["code"] == "job_not_found"

    run(main)


@pytest.mark.slow
def test_pusht_session_round_trip_over_http() -> None:
    pytest.importorskip("gym_pusht")

    async def main() -> None:
        async with server() as srv:
            c, alice = srv.client, srv.auth("alice")
            spec = {"kind": "pusht", "image_size": 32, "num_envs": 2, "max_episode_steps": 3}
            r = await c.post("/v1/env/sessions", headers=alice, json={"spec": spec})
            assert r.status_code == 202, r.text
            done = await srv.wait_future("alice", r.json()["future_id"])
            assert done["state"] == "succeeded", done
            session = done["result"]
            sid = session["session_id"]
            assert session["schema"]["action_dim"] == 2 and session["num_envs"] == 2
            (cam,) = session["schema"]["cameras"]

            status, obs = await srv.msgpack(
                "POST",
                f"/v1/env/sessions/{sid}/reset",
                "alice",
                json={"rollout_id": "r1", "seed": 3},
            )
            assert status == 200
            assert obs["cameras"][cam].shape == (2, 32, 32, 3)
            assert obs["cameras"][cam].dtype == np.uint8
            assert obs["state"].dtype == np.float32 and obs["state"].shape[0] == 2

            finals = 0
            for _ in range(3):
                status, step = await srv.msgpack(
                    "POST",
                    f"/v1/env/sessions/{sid}/step",
                    "alice",
                    {"actions": np.full((2, 2), 256.0, np.float32)},
                )
                assert status == 200, step
                assert step["reward"].shape == (2,) and step["rollout_id"] == "r1"
                finals += step["final_observation"] is not None
            assert finals == 1  # the 3-step episode truncated and auto-reset once

            # JSON tensors work too, and a wrong action shape is a clear 422
            r = await c.post(
                f"/v1/env/sessions/{sid}/step",
                headers=alice,
                json={"actions": _json_tensor(np.zeros((2, 3), np.float32))},
            )
            assert r.status_code == 422 and "action_dim" in r.json()["message"]

            r = await c.get("/v1/env/sessions", headers=alice)
            assert [s["session_id"] for s in r.json()] == [sid]
            assert (await c.delete(f"/v1/env/sessions/{sid}", headers=alice)).status_code == 204
            r = await c.post(
                f"/v1/env/sessions/{sid}/reset", headers=alice, json={"rollout_id": "r2"}
            )
            assert r.status_code == 404

    run(main)
