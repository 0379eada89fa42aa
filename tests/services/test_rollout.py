"""Rollout: env loop over predict(mode="sample") writing the RL partition layout."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joynexus.envs.base import EnvSpec
from joynexus.errors import NotFoundError, SchemaMismatchError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.policies import OFTHeadConfig
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService, RolloutConfig
from joynexus.services.tenancy import TenantConfig

pytest.importorskip("gym_pusht")

RL_FIELDS = {
    "obs.top",
    "state",
    "instruction",
    "actions",
    "log_probs",
    "values",
    "rewards",
    "dones",
    "t",
    "env",
    "bootstrap_values",
}


def test_rollout_writes_num_envs_times_horizon_samples(tiny_backbone: Any) -> None:
    base: ResidentBaseModel = tiny_backbone("qwen2_5_vl")
    num_envs, horizon = 2, 3

    async def main() -> None:
        env = EnvironmentService()
        queue = TrainingQueue()
        svc = InferenceModelService(base, env, queue, max_batch_size=num_envs)
        spec = EnvSpec(kind="pusht", num_envs=num_envs, image_size=32)
        try:
            await svc.start()
            session = await env.create_session("pt", spec)
            schema = session.schema
            await svc.add_tenant(
                TenantConfig(
                    tenant_id="pt",
                    schema_=schema,
                    head=OFTHeadConfig(hidden_dim=32, num_blocks=1),
                    value_head=True,
                    output_dir=Path("."),
                )
            )
            sig = svc.serving_slot("pt").schema_signature
            cfg = RolloutConfig(
                tenant_id="pt", session_id=session.session_id, schema_signature=sig, seed=3
            )
            beats: list[int] = []
            stats = await svc.rollout(
                cfg, "job-1", "part-1", num_envs, horizon, 0, heartbeat=lambda: beats.append(1)
            )
            assert stats.num_samples == num_envs * horizon
            assert len(beats) >= horizon
            # Each decision executed its whole chunk open-loop: action_chunk env steps.
            assert svc.metrics.completed == horizon + 1  # + the bootstrap-value predict

            info = queue.info("part-1")
            assert info.num_samples == num_envs * horizon
            assert set(info.fields) == RL_FIELDS
            meta = queue.get_meta("part-1", sorted(RL_FIELDS), 100, "check")
            assert {m.behavior_policy_version for m in meta.sample_meta} == {0}
            assert {(m.tenant_id, m.schema_signature) for m in meta.sample_meta} == {("pt", sig)}
            data = queue.get_data(meta)
            np.testing.assert_array_equal(data["t"], np.repeat(np.arange(horizon), num_envs))
            np.testing.assert_array_equal(data["env"], np.tile(np.arange(num_envs), horizon))
            assert data["actions"].shape == (6, schema.action_chunk, schema.action_dim)
            assert data["obs.top"].shape == (6, 32, 32, 3) and data["obs.top"].dtype == np.uint8
            assert data["instruction"].dtype == np.dtype("<U256")
            assert data["log_probs"].dtype == np.float32 and np.isfinite(data["log_probs"]).all()
            assert data["dones"].dtype == np.bool_
            boot = data["bootstrap_values"].reshape(horizon, num_envs)
            assert (boot == boot[0]).all()

            with pytest.raises(SchemaMismatchError):
                await svc.rollout(
                    cfg.model_copy(update={"schema_signature": "sig-x"}), "j2", "p2", 2, 1, 0
                )
            await svc.add_tenant(
                TenantConfig(tenant_id="thief", schema_=schema, output_dir=Path("."))
            )
            # Another tenant's session is unknown to the thief (no existence oracle).
            with pytest.raises(NotFoundError, match="no environment session"):
                await svc.rollout(
                    cfg.model_copy(update={"tenant_id": "thief"}), "j3", "p3", 2, 1, 0
                )
            assert not queue.has_partition("p2") and not queue.has_partition("p3")
        finally:
            await svc.stop()
            await env.aclose()

    asyncio.run(main())
