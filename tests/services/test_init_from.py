"""The SFT → RL handoff: a tenant's slot starts from another tenant's checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from joynexus.errors import SchemaMismatchError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.normalization import FeatureNormStats, NormalizationStats
from joynexus.queues.training import TrainingQueue
from joynexus.services.tenancy import TenantConfig
from joynexus.services.training import TrainBatch, TrainingModelService
from tests.services.test_training_service import OTHER, SCHEMA, config


def _stats(dim: int, scale: float) -> FeatureNormStats:
    return FeatureNormStats(
        mean=[scale] * dim, std=[2 * scale] * dim, q01=[-scale] * dim, q99=[scale] * dim
    )


def _sft_tenant(out: Path) -> TenantConfig:
    norm = NormalizationStats(state=_stats(SCHEMA.state_dim, 0.5), action=_stats(2, 3.0))
    return config("sft", out).model_copy(update={"normalization": norm})


def test_rl_tenant_starts_from_the_sft_checkpoint(base: ResidentBaseModel, tmp_path: Path) -> None:
    async def main() -> None:
        svc = TrainingModelService(base, TrainingQueue(), output_dir=tmp_path)
        await svc.add_tenant(_sft_tenant(tmp_path))
        obs = ObservationBatch.synthetic(SCHEMA, 4, seed=1)
        for _ in range(3):  # the SFT weights move away from any initialisation
            await svc.train_batch("sft", TrainBatch(observations=obs, loss="sft"))
        (ckpt,) = await svc.save(3, ["sft"])
        sft = svc._executor.slot("sft")

        rl = config("rl", tmp_path, algo="ppo", value_head=True)
        await svc.add_tenant(rl.model_copy(update={"init_checkpoint": ckpt}))
        slot = svc._executor.slot("rl")
        for name, tensor in sft.state_tensors().items():  # every SFT tensor, copied
            assert torch.equal(slot.state_tensors()[name], tensor), name
        assert slot.value_head is not None  # the PPO critic kept its own initialisation
        assert slot.normalization == sft.normalization  # serves in the SFT data's units
        assert slot.policy_version == 0 and svc.policy_version("rl") == 0
        # It trains on from there, on its own optimizer.
        res = await svc.train_batch(
            "rl",
            TrainBatch(observations=obs, loss="reinforce", advantages=torch.ones(4).numpy()),
        )
        assert res.policy_version == 1 and svc.policy_version("sft") == 3
        # A checkpoint of another interface is refused before anything is loaded.
        other = config("other", tmp_path, schema=OTHER)
        with pytest.raises(SchemaMismatchError, match="schema signature"):
            await svc.add_tenant(other.model_copy(update={"init_checkpoint": ckpt}))
        assert "other" not in svc.tenant_ids()

    asyncio.run(main())
