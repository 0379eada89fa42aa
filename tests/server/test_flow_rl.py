"""RL primitives over HTTP on a flow-matching head: predict returns the Flow-SDE chain,
train_batch takes it back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from tests.server.livesrv import live, reach_custom
from tests.server.test_models import _obs, _post


def test_flow_chain_round_trip_over_http(tmp_path: Path, tiny_model: str) -> None:
    spec = reach_custom("alice", tiny_model)
    spec["action_module"] = {
        "type": "flow_matching",
        "hidden_dim": 32,
        "num_layers": 1,
        "num_heads": 2,
        "num_inference_steps": 3,
    }
    spec["algorithm"] = {"name": "ppo"}

    async def main() -> None:
        async with live(tmp_path, tiny_model) as lv:
            r = await lv.submit("alice", spec)
            await lv.wait_state("alice", r.json()["workload_id"], ["running"])
            obs = _obs(4)
            code, pred = await _post(
                lv, "alice", "predict", {"observations": obs, "mode": "sample"}
            )
            assert code == 200, pred
            assert pred["flow_chain"].shape == (4, 4, 1, 2) and pred["log_probs"].shape == (4,)
            np.testing.assert_array_equal(pred["flow_chain"][:, -1], pred["actions"])
            _, mean = await _post(lv, "alice", "predict", {"observations": obs})
            assert mean.get("flow_chain") is None  # the ODE has no chain to record

            step = {
                "observations": {**obs, "actions": pred["actions"]},
                "loss": "ppo",
                "advantages": np.array([1.0, -1.0, 0.5, -0.5], np.float32),
                "old_log_probs": pred["log_probs"],
            }
            code, body = await _post(lv, "alice", "train_batch", step)
            assert code == 400 and "flow_chain" in body["message"], body
            code, body = await _post(
                lv, "alice", "train_batch", {**step, "flow_chain": pred["flow_chain"][:, :, :, :1]}
            )
            assert code == 422 and "flow_chain" in body["message"], body
            code, out = await _post(
                lv, "alice", "train_batch", {**step, "flow_chain": pred["flow_chain"]}
            )
            assert code == 200 and out["policy_version"] == 1, out

    asyncio.run(main())
