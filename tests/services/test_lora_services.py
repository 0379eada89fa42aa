"""LoRA tenants through the model services: mixed-adapter serving with per-tenant
publication, and grouped ``train_jobs`` equal to serial training."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from joynexus.control.job import TaskType
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.lora import LoRAConfig
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.tenant.slots import OptimizerConfig
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.tenancy import TenantConfig
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import AlgorithmSpec
from tests.services.test_training_service import SCHEMA, make_job, put_rl, put_sft

PLAIN = OFTHeadConfig(hidden_dim=32, num_blocks=1)


def lora_head(rank: int) -> OFTHeadConfig:
    return OFTHeadConfig(hidden_dim=32, num_blocks=1, lora=LoRAConfig(rank=rank, alpha=rank))


def config(
    tid: str,
    out: Path,
    head: OFTHeadConfig,
    *,
    algo: str = "sft",
    value_head: bool = False,
    mb: int = 4,
    seed: int = 7,
) -> TenantConfig:
    return TenantConfig(
        tenant_id=tid,
        schema_=SCHEMA,
        head=head,
        optimizer=OptimizerConfig(lr=1e-3),
        value_head=value_head,
        algorithm=AlgorithmSpec(name=algo, microbatch_size=mb),
        seed=seed,
        output_dir=out,
    )


def _count_rows(base: ResidentBaseModel, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    rows: list[int] = []
    encode = base.encode

    def counting(feature: Any, **kw: Any) -> Any:
        out = encode(feature, **kw)
        rows.append(int(out.hidden_states.shape[0]))
        return out

    monkeypatch.setattr(base, "encode", counting)
    return rows


def test_lora_tenants_batch_with_everyone_and_publish_alone(
    base: ResidentBaseModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _count_rows(base, monkeypatch)

    async def main() -> None:
        svc = InferenceModelService(
            base, EnvironmentService(), TrainingQueue(), max_batch_size=64, max_wait_s=0.2
        )
        async with svc:
            await svc.add_tenant(config("a", tmp_path, lora_head(4)))
            await svc.add_tenant(config("b", tmp_path, PLAIN, seed=8))
            await svc.add_tenant(config("c", tmp_path, lora_head(8), seed=9))
            obs = ObservationBatch.synthetic(SCHEMA, 2, seed=0, with_actions=False)
            alone = {t: (await svc.predict(obs, t)).actions for t in "abc"}
            rows.clear()
            together = await asyncio.gather(*(svc.predict(obs, t) for t in "abc"))
            assert rows == [6], rows  # ONE mixed-adapter forward for the three tenants
            for t, res in zip("abc", together, strict=True):
                np.testing.assert_allclose(res.actions, alone[t], rtol=1e-5, atol=1e-6)

            # Publish a new adapter for "a" only; keep version 0 pinned and ask both
            # versions of "a" in the same batch as the others.
            tensors = {
                n: (t + 0.05 if n.startswith("lora.B.") else t)
                for n, t in svc.serving_slot("a").state_tensors().items()
            }
            with svc.pinned("a") as v0:
                await svc.load_weights("a", 1, tensors)
                rows.clear()
                old, new, b, c = await asyncio.gather(
                    svc.predict(obs, "a", v0),
                    svc.predict(obs, "a"),
                    svc.predict(obs, "b"),
                    svc.predict(obs, "c"),
                )
            assert rows == [8], rows
            assert (old.policy_version, new.policy_version) == (0, 1)
            np.testing.assert_allclose(old.actions, alone["a"], rtol=1e-5, atol=1e-6)
            assert not np.allclose(new.actions, alone["a"], atol=1e-4)
            np.testing.assert_allclose(b.actions, alone["b"], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(c.actions, alone["c"], rtol=1e-5, atol=1e-6)

    asyncio.run(main())


def test_lora_train_jobs_group_and_equal_serial(
    base: ResidentBaseModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _count_rows(base, monkeypatch)

    async def run(grouped: bool) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
        svc = TrainingModelService(base, TrainingQueue(), output_dir=tmp_path / str(grouped))
        sig = (await svc.add_tenant(config("s4", tmp_path, lora_head(4)))).schema_signature
        await svc.add_tenant(config("s8", tmp_path, lora_head(8), seed=3))
        await svc.add_tenant(
            config("r", tmp_path, lora_head(4), algo="ppo", value_head=True, mb=3, seed=5)
        )
        await svc.add_tenant(config("p", tmp_path, PLAIN, seed=6))
        put_sft(svc.queue, "p4", "s4", sig, 8, seed=1)
        put_sft(svc.queue, "p8", "s8", sig, 8, seed=2)
        put_rl(svc.queue, "pr", "r", sig, 6, seed=3)
        put_sft(svc.queue, "pp", "p", sig, 8, seed=4)
        jobs = [
            make_job("s4", "p4", 8, sig, job_id="j4"),
            make_job("s8", "p8", 8, sig, job_id="j8"),
            make_job("r", "pr", 6, sig, job_id="jr", task=TaskType.RL),
            make_job("p", "pp", 8, sig, job_id="jp"),
        ]
        if grouped:
            results = await svc.train_jobs(jobs)
        else:
            results = [await svc.train_job(j) for j in jobs]
        assert [r.policy_version for r in results] == [2, 2, 2, 2]
        payload = await svc.export_params("s8")
        assert any(n.startswith("lora.") for n in payload.named_tensors)
        return [r.losses for r in results], payload.named_tensors

    grouped, g_tensors = asyncio.run(run(True))
    assert rows == [4 + 4 + 3 + 4] * 2  # one mixed forward per microbatch round
    rows.clear()
    serial, s_tensors = asyncio.run(run(False))
    assert rows == [4, 4, 4, 4, 3, 3, 4, 4]
    for g, s in zip(grouped, serial, strict=True):
        np.testing.assert_allclose(g, s, rtol=1e-4, atol=1e-6)
    for name, t in g_tensors.items():
        torch.testing.assert_close(t, s_tensors[name], rtol=1e-4, atol=1e-5, msg=name)
    assert all(p.grad is None for p in base.model.parameters())


def test_training_service_refuses_a_tenant_past_its_memory_budget(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    from joynexus.errors import CapacityError

    async def main() -> None:
        probe = TrainingModelService(base, TrainingQueue(), output_dir=tmp_path / "probe")
        await probe.add_tenant(config("x", tmp_path, lora_head(8)))
        need = probe._executor.slot("x").training_bytes()
        svc = TrainingModelService(
            base, TrainingQueue(), output_dir=tmp_path, tenant_memory_budget=2 * need
        )
        await svc.add_tenant(config("a", tmp_path, lora_head(8)))
        await svc.add_tenant(config("b", tmp_path, lora_head(8), seed=1))
        with pytest.raises(CapacityError, match="tenant memory budget") as info:
            await svc.add_tenant(config("c", tmp_path, lora_head(8), seed=2))
        assert info.value.http_status == 429
        assert svc.tenant_ids() == ["a", "b"]

    asyncio.run(main())
