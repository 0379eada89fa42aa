"""The SFT → RL handoff: a tenant's slot starts from another tenant's checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
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


@pytest.mark.parametrize("source_task", ["sft", "rl"])
def test_exploration_noise_is_the_rl_tenants_own_after_sft(
    base: ResidentBaseModel, tmp_path: Path, source_task: str
) -> None:
    """SFT never trains the Gaussian head's log-std: from an SFT checkpoint the RL tenant
    keeps the noise its own head declares; from an RL checkpoint it takes the learned one."""

    async def main() -> None:
        svc = TrainingModelService(base, TrainingQueue(), output_dir=tmp_path)
        await svc.add_tenant(_sft_tenant(tmp_path))
        src = svc._executor.slot("sft")
        with torch.no_grad():
            src.action_module.log_std.fill_(-0.5)  # type: ignore[operator]
        (ckpt,) = await svc.save(1, ["sft"], ledger={"task": source_task})

        rl = config("rl", tmp_path, algo="ppo", value_head=True)
        head = rl.head.model_copy(update={"init_log_std": -2.5})
        await svc.add_tenant(rl.model_copy(update={"head": head, "init_checkpoint": ckpt}))
        got = svc._executor.slot("rl").state_tensors()
        want = -2.5 if source_task == "sft" else -0.5
        noise = [k for k in got if k.endswith(".log_std")]
        assert noise and all(torch.allclose(got[k], torch.full_like(got[k], want)) for k in noise)
        for name, tensor in src.state_tensors().items():  # the rest is the source's
            if name not in noise:
                assert torch.equal(got[name], tensor), name

    asyncio.run(main())


def test_rl_tenant_is_anchored_to_the_sft_policy_it_started_from(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    """The slot freezes the SFT policy as its KL reference; RL updates move the head,
    never the reference, and the anchor's KL is reported once they have."""

    async def main() -> None:
        svc = TrainingModelService(base, TrainingQueue(), output_dir=tmp_path)
        await svc.add_tenant(_sft_tenant(tmp_path))
        obs = ObservationBatch.synthetic(SCHEMA, 4, seed=1)
        await svc.train_batch("sft", TrainBatch(observations=obs, loss="sft"))
        (ckpt,) = await svc.save(1, ["sft"])
        rl = config("rl", tmp_path, algo="reinforce")
        algorithm = rl.algorithm.model_copy(update={"kl_coef": 1.0})
        await svc.add_tenant(
            rl.model_copy(update={"init_checkpoint": ckpt, "algorithm": algorithm})
        )
        slot = svc._executor.slot("rl")
        reference = slot.reference_module
        assert reference is not None
        sft = svc._executor.slot("sft").action_module.state_dict()
        frozen = {k: v.clone() for k, v in reference.state_dict().items()}
        for name, tensor in frozen.items():
            if not name.endswith("log_std"):  # the RL tenant's own exploration noise
                assert torch.equal(tensor, sft[name]), name
        assert not any(p.requires_grad for p in reference.parameters())
        for _ in range(2):
            await svc.train_batch(
                "rl",
                TrainBatch(observations=obs, loss="reinforce", advantages=torch.ones(4).numpy()),
            )
        moved = slot.action_module.state_dict()
        assert any(not torch.equal(moved[k], frozen[k]) for k in frozen)
        for name, tensor in reference.state_dict().items():
            assert torch.equal(tensor, frozen[name]), name
        # A tenant without init_from has no reference.
        await svc.add_tenant(config("fresh", tmp_path, algo="reinforce"))
        assert svc._executor.slot("fresh").reference_module is None

    asyncio.run(main())


def test_first_rollout_from_sft_plays_the_sft_policys_evaluation_episodes(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    """The first GRPO rollout from an SFT checkpoint runs the SFT policy itself.

    With its exploration noise at the floor (``init_log_std`` −10), the RL tenant's
    first grouped rollout — served from its init_from slot, so with the SFT weights and
    the SFT normalization — plays each group's episode exactly as the SFT tenant's own
    deterministic evaluation plays the same seed (same env, horizon and success
    criterion): episode ``g`` of an evaluation from seed ``s`` and group ``g`` of a
    rollout from ``s`` start from one initial state. A handoff that lost the weights,
    the normalization or the observation config would play other episodes.
    """
    from joynexus.envs import env_schema
    from joynexus.envs.base import EnvSpec
    from joynexus.envs.seeds import grouped_rollout_seed
    from joynexus.models.policies import OFTHeadConfig
    from joynexus.services.environment import EnvironmentService
    from joynexus.services.inference import InferenceModelService, RolloutConfig
    from tests.services.test_normalization import STATS

    spec = EnvSpec(kind="reach2d", num_envs=4, image_size=32, max_episode_steps=8)
    schema = env_schema(spec)
    group_size, horizon = 2, 8  # reach2d: one env step per decision, so every episode ends
    seed = grouped_rollout_seed(0, 1, spec.num_envs // group_size)

    def tenant(tid: str, init_log_std: float) -> TenantConfig:
        head = OFTHeadConfig(hidden_dim=32, num_blocks=1, init_log_std=init_log_std)
        return TenantConfig(tenant_id=tid, schema_=schema, head=head, seed=3, output_dir=tmp_path)

    async def main() -> tuple[list[float], np.ndarray, np.ndarray, np.ndarray]:
        env, queue = EnvironmentService(), TrainingQueue()
        training = TrainingModelService(base, queue, output_dir=tmp_path)
        inference = InferenceModelService(base, env, queue)
        try:
            await inference.start()
            sft = tenant("sft", -1.0).model_copy(update={"normalization": STATS})
            await training.add_tenant(sft)
            obs = ObservationBatch.synthetic(schema, 8, seed=1)
            for _ in range(3):  # weights of its own, away from any initialisation
                await training.train_batch("sft", TrainBatch(observations=obs, loss="sft"))
            (ckpt,) = await training.save(3, ["sft"], ledger={"task": "sft"})
            rl = tenant("rl", -10.0).model_copy(update={"init_checkpoint": ckpt})
            await training.add_tenant(rl)
            for cfg in (sft, rl):  # served as the workflow serves them (launch.start_tenant)
                await inference.add_tenant(cfg, await training.export_params(cfg.tenant_id))
            evaluated = await env.create_session("sft", spec)
            ev = await inference.evaluate(
                "sft", evaluated.session_id, episodes=spec.num_envs // group_size, seed=seed
            )
            session = await env.create_session("rl", spec)
            config = RolloutConfig(
                tenant_id="rl",
                session_id=session.session_id,
                schema_signature=inference.serving_slot("rl").schema_signature,
                seed=seed,
                group_size=group_size,
            )
            await inference.rollout(config, "job-1", "p", spec.num_envs, horizon, 0)
            meta = queue.get_meta("p", ["rewards", "dones", "env"], 1000, "check")
            data = {k: np.asarray(v) for k, v in queue.get_data(meta).items()}
            return list(ev.episode_returns), data["rewards"], data["dones"], data["env"]
        finally:
            await inference.stop()
            await env.aclose()

    returns, rewards, dones, envs = asyncio.run(main())
    for i in range(4):  # each sub-env's first episode: its rewards up to its first done
        r, d = rewards[envs == i], dones[envs == i]
        assert d.any(), f"sub-env {i}'s episode did not end within the rollout"
        first = float(r[: int(np.argmax(d)) + 1].sum())
        assert first == pytest.approx(returns[i // group_size], abs=1e-3), i
    assert len(set(np.round(returns, 3))) == len(returns)  # the groups' states differ
