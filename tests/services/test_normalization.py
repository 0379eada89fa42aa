"""Normalization stats travel with the tenant: serving speaks env units, training doesn't.

An SFT tenant trains on normalized state/actions. Its ``NormalizationStats`` (from
``TenantConfig.normalization`` or a payload) make predict / evaluate / rollout
normalize the env state before the head and un-normalize the actions after it, while
rollout partitions keep the normalized units the tenant trains on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joynexus.envs import env_schema
from joynexus.envs.base import EnvSpec
from joynexus.errors import SchemaMismatchError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.payload import export_params
from joynexus.models.normalization import FeatureNormStats, NormalizationStats
from joynexus.models.policies import OFTHeadConfig
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService, RolloutConfig
from joynexus.services.tenancy import TenantConfig, build_slot
from tests.models.reference import load_slot, save_slot

SPEC = EnvSpec(kind="reach2d", num_envs=4, image_size=32)
SCHEMA = env_schema(SPEC)
ACTION_MEAN = [0.5, -0.5]


def _feat(mean: list[float], std: list[float]) -> FeatureNormStats:
    m, s = np.asarray(mean), np.asarray(std)
    return FeatureNormStats(
        mean=m.tolist(), std=s.tolist(), q01=(m - 2 * s).tolist(), q99=(m + 2 * s).tolist()
    )


# Normalized state = (s - 1) / 2 < 0 for every reach2d state (coordinates in [-1, 1]).
STATS = NormalizationStats(state=_feat([1.0] * 4, [2.0] * 4), action=_feat(ACTION_MEAN, [0.1, 0.1]))


def config(tid: str, normalization: NormalizationStats | None = STATS) -> TenantConfig:
    return TenantConfig(
        tenant_id=tid,
        schema_=SCHEMA,
        head=OFTHeadConfig(hidden_dim=32, num_blocks=1),
        seed=3,
        output_dir=Path("."),
        normalization=normalization,
    )


def test_predict_normalizes_state_in_and_unnormalizes_actions_out(base: ResidentBaseModel) -> None:
    obs = ObservationBatch.synthetic(SCHEMA, 3, seed=1)
    obs = ObservationBatch(cameras=obs.cameras, state=obs.state, instructions=obs.instructions)

    async def main() -> None:
        env = EnvironmentService()
        svc = InferenceModelService(base, env, TrainingQueue())
        try:
            await svc.start()
            await svc.add_tenant(config("sft"))
            await svc.add_tenant(config("raw", None))  # same seed: the same weights
            served = await svc.predict(obs, "sft")
            normalized = ObservationBatch(
                cameras=obs.cameras,
                state=STATS.normalize(obs.state, "state"),
                instructions=obs.instructions,
            )
            raw = await svc.predict(normalized, "raw")
            np.testing.assert_allclose(
                served.actions, STATS.unnormalize(raw.actions, "action"), atol=1e-5
            )
        finally:
            await svc.stop()
            await env.aclose()

    asyncio.run(main())


def test_sft_tenant_evaluated_in_reach2d_acts_in_env_units(base: ResidentBaseModel) -> None:
    executed: list[np.ndarray] = []

    async def main() -> None:
        env = EnvironmentService()
        step = env.step

        async def recording_step(session_id: str, action: np.ndarray, **kw: Any) -> Any:
            executed.append(np.asarray(action).copy())
            return await step(session_id, action, **kw)

        env.step = recording_step  # type: ignore[method-assign]
        svc = InferenceModelService(base, env, TrainingQueue())
        try:
            await svc.start()
            # Added without stats in the config: the payload carries them (an exported
            # module stays usable wherever it is loaded).
            trained = build_slot(config("sft"), base)
            payload = export_params(trained)
            assert payload.normalization == STATS
            await svc.add_tenant(config("sft", None), payload)
            session = await env.create_session("sft", SPEC)
            result = await svc.evaluate("sft", session.session_id, episodes=4, seed=0)
            assert result.episodes == 4
        finally:
            await svc.stop()
            await env.aclose()

    asyncio.run(main())
    actions = np.concatenate(executed)
    # The head's output starts near 0 in normalized units, i.e. near the action mean in
    # env units; a tenant served without its stats would send ~0 to the env.
    np.testing.assert_allclose(actions.mean(axis=0), ACTION_MEAN, atol=0.05)


def test_rollout_stores_normalized_state_and_actions(base: ResidentBaseModel) -> None:
    async def main() -> dict[str, np.ndarray]:
        env = EnvironmentService()
        queue = TrainingQueue()
        svc = InferenceModelService(base, env, queue)
        try:
            await svc.start()
            await svc.add_tenant(config("sft"))
            session = await env.create_session("sft", SPEC)
            sig = svc.serving_slot("sft").schema_signature
            cfg = RolloutConfig(
                tenant_id="sft", session_id=session.session_id, schema_signature=sig, seed=0
            )
            await svc.rollout(cfg, "j", "p", SPEC.num_envs, 3, 0)
            meta = queue.get_meta("p", ["state", "actions"], 100, "check")
            return {k: np.asarray(v) for k, v in queue.get_data(meta).items()}
        finally:
            await svc.stop()
            await env.aclose()

    data = asyncio.run(main())
    assert data["state"].max() < 0.0  # (s - 1) / 2, not the env's [-1, 1] coordinates
    # Sampled in normalized units around ~0 (std e^-1), not around the env-unit mean.
    assert abs(float(data["actions"].mean())) < 0.3
    assert np.abs(data["actions"].reshape(-1, 2).mean(axis=0) - ACTION_MEAN).max() > 0.3


def test_checkpoints_carry_the_stats_and_mismatched_stats_are_refused(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    slot = build_slot(config("sft"), base)
    path = save_slot(slot, tmp_path, 1)
    assert (path / "normalization.json").is_file()
    fresh = build_slot(config("sft", None), base)
    load_slot(fresh, path)
    assert fresh.normalization == STATS
    wide = NormalizationStats(action=_feat([0.0] * 3, [1.0] * 3))
    with pytest.raises(SchemaMismatchError, match="action_dim 2"):
        build_slot(config("sft", wide), base)


# A gripper held closed in every demonstration: its action dimension has std 0.
CONSTANT_DIM = NormalizationStats(
    state=_feat([1.0] * 4, [2.0] * 4), action=_feat([0.5, -1.0], [0.1, 0.0])
)


def test_a_constant_action_dimension_survives_the_trip_through_robot_units() -> None:
    x = np.random.default_rng(0).normal(0.0, 0.14, (2000, 2)).astype(np.float32)
    back = CONSTANT_DIM.normalize(CONSTANT_DIM.unnormalize(x, "action"), "action")
    # Floored at eps = 1e-6 alone, the constant dim came back in steps of 0.06-0.12.
    np.testing.assert_allclose(back, x, atol=1e-3)
    env = CONSTANT_DIM.unnormalize(x, "action")
    assert np.abs(env[:, 1] + 1.0).max() < 1e-2  # still (nearly) the constant to the robot


def test_rollout_log_probs_are_those_of_the_actions_the_actor_trains_on(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    """The behaviour log-probs a rollout stores must be the actor's log-probs of the
    stored actions under the same weights (PPO's ratio starts at exactly 1), also with a
    constant action dimension in the stats."""
    from joynexus.control.job import TaskType
    from joynexus.services.training import TrainingModelService
    from joynexus.spec.workload import AlgorithmSpec
    from tests.services.test_training_service import make_job

    cfg = config("rl", CONSTANT_DIM).model_copy(
        update={"algorithm": AlgorithmSpec(name="ppo", microbatch_size=12), "output_dir": tmp_path}
    )

    async def main() -> dict[str, np.ndarray]:
        env = EnvironmentService()
        queue = TrainingQueue()
        svc = InferenceModelService(base, env, queue)
        training = TrainingModelService(base, queue, output_dir=tmp_path)
        try:
            await svc.start()
            await svc.add_tenant(cfg)
            info = await training.add_tenant(cfg)
            session = await env.create_session("rl", SPEC)
            rollout = RolloutConfig(
                tenant_id="rl",
                session_id=session.session_id,
                schema_signature=info.schema_signature,
                seed=0,
            )
            await svc.rollout(rollout, "j", "p", SPEC.num_envs, 3, 0)
            job = make_job("rl", "p", 12, info.schema_signature, TaskType.RL)
            await training.actor_forward(job)
            meta = queue.get_meta("p", ["log_probs", "actor_log_probs"], 100, "check")
            return {k: np.asarray(v) for k, v in queue.get_data(meta).items()}
        finally:
            await svc.stop()
            await env.aclose()

    data = asyncio.run(main())
    np.testing.assert_allclose(data["actor_log_probs"], data["log_probs"], atol=1e-3)
