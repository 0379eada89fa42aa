"""The Inference Model Service contract, run against the real service (tiny backbone,
reach2d simulator workers) and the fake: serving versions, predict's shapes and errors,
the export_params → load_weights publication round trip, rollouts and evaluations."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from joynexus.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    SchemaMismatchError,
    ServiceUnavailableError,
)
from joynexus.models.checkpoints.payload import TenantPayload
from joynexus.queues.inference_metrics import InferenceQueueMetrics
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.protocols import (
    EnvironmentServiceAPI,
    InferenceModelServiceAPI,
    TrainingModelServiceAPI,
)
from joynexus.services.rollout import RolloutConfig
from joynexus.services.training import TrainBatch, TrainingModelService
from tests.contracts.conftest import ENV_SPEC, SCHEMA, AnyBase, observations, tenant_config
from tests.fakes.base import FakeBase
from tests.fakes.environment import FakeEnvironmentService
from tests.fakes.inference import FakeInferenceService
from tests.fakes.training import FakeTrainingService

A, B = "alice", "bob"


@dataclasses.dataclass
class Plane:
    inference: InferenceModelServiceAPI
    training: TrainingModelServiceAPI
    env: EnvironmentServiceAPI
    queue: TrainingQueue


def with_plane(
    base: AnyBase, out: Path, body: Callable[[Plane], Awaitable[None]], *, start: bool = True
) -> None:
    async def main() -> None:
        queue = TrainingQueue()
        if isinstance(base, FakeBase):
            fake_env = FakeEnvironmentService()
            plane = Plane(
                FakeInferenceService(base, fake_env, queue),
                FakeTrainingService(base, queue, output_dir=out),
                fake_env,
                queue,
            )
        else:
            env = EnvironmentService()
            plane = Plane(
                InferenceModelService(base, env, queue, max_wait_s=0.0),
                TrainingModelService(base, queue, output_dir=out),
                env,
                queue,
            )
        if start:
            await plane.inference.start()
        try:
            await body(plane)
        finally:
            await plane.inference.stop()
            await plane.env.aclose()

    asyncio.run(main())


def test_serving_versions_and_unknown_tenants(base: AnyBase, tmp_path: Path) -> None:
    async def body(p: Plane) -> None:
        svc = p.inference
        assert isinstance(svc.metrics, InferenceQueueMetrics)
        await svc.add_tenant(tenant_config(A, tmp_path))
        assert svc.current_policy_version(A) == 0
        with pytest.raises(ConflictError, match="already served"):
            await svc.add_tenant(tenant_config(A, tmp_path))
        with pytest.raises(NotFoundError, match="ghost"):
            svc.current_policy_version("ghost")
        with pytest.raises(NotFoundError, match="ghost"):
            await svc.predict(observations(1), "ghost")
        with pytest.raises(NotFoundError, match="ghost"):
            await svc.load_weights("ghost", 1, {})
        with pytest.raises(NotFoundError, match="ghost"):
            await svc.remove_tenant("ghost")
        await svc.remove_tenant(A)
        with pytest.raises(NotFoundError, match=A):
            svc.current_policy_version(A)

    with_plane(base, tmp_path, body)


def test_predict_answers_the_schemas_shapes(base: AnyBase, tmp_path: Path) -> None:
    async def body(p: Plane) -> None:
        svc = p.inference
        await svc.add_tenant(tenant_config(A, tmp_path))
        await svc.add_tenant(tenant_config(B, tmp_path, algo="ppo", value_head=True))
        n, chunk, dim = 3, SCHEMA.action_chunk, SCHEMA.action_dim
        mean = await svc.predict(observations(n), A)
        assert mean.actions.shape == (n, chunk, dim) and mean.actions.dtype == np.float32
        assert mean.policy_version == 0 and mean.values is None
        sample = await svc.predict(observations(n), B, 0, mode="sample", session_id="s")
        assert sample.actions.shape == (n, chunk, dim)
        assert sample.log_probs is not None and sample.log_probs.shape == (n,)
        assert sample.values is not None and sample.values.shape == (n,)
        assert sample.log_probs.dtype == sample.values.dtype == np.float32
        bad = dataclasses.replace(observations(n), state=np.zeros((n, 9), np.float32))
        with pytest.raises(SchemaMismatchError):
            await svc.predict(bad, A)
        with pytest.raises(ConflictError, match="not served"):
            await svc.predict(observations(n), A, policy_version=7)

    with_plane(base, tmp_path, body)


def test_predict_needs_a_started_service(base: AnyBase, tmp_path: Path) -> None:
    async def body(p: Plane) -> None:
        await p.inference.add_tenant(tenant_config(A, tmp_path))
        with pytest.raises(ServiceUnavailableError, match="not running"):
            await p.inference.predict(observations(1), A)

    with_plane(base, tmp_path, body, start=False)


def test_exported_params_load_as_the_next_served_version(base: AnyBase, tmp_path: Path) -> None:
    async def body(p: Plane) -> None:
        config = tenant_config(A, tmp_path)
        sig = (await p.training.add_tenant(config)).schema_signature
        await p.inference.add_tenant(config)
        await p.training.train_batch(A, TrainBatch(observations(2)))
        payload = await p.training.export_params(A)
        named = dict(payload.named_tensors)
        await p.inference.load_weights(A, payload.policy_version, named)
        assert p.inference.current_policy_version(A) == 1
        assert (await p.inference.predict(observations(2), A)).policy_version == 1
        with pytest.raises(ConflictError, match="already served"):
            await p.inference.load_weights(A, 0, named)
        name = next(iter(named))
        with pytest.raises(InvalidRequestError):
            await p.inference.load_weights(A, 2, {**named, "no.such.tensor": named[name]})
        with pytest.raises(InvalidRequestError):
            await p.inference.load_weights(A, 2, {k: v for k, v in named.items() if k != name})
        nan = {**named, name: torch.full_like(named[name], float("nan"))}
        with pytest.raises(InvalidRequestError, match="NaN"):
            await p.inference.load_weights(A, 2, nan)
        assert p.inference.current_policy_version(A) == 1  # nothing refused was served
        # A tenant added with a payload is served at its version; another interface's
        # payload is refused.
        await p.inference.add_tenant(
            tenant_config(B, tmp_path), dataclasses.replace(payload, tenant_id=B)
        )
        assert p.inference.current_policy_version(B) == 1
        foreign = TenantPayload("carol", 3, "sig-of-another-interface", named)
        assert foreign.schema_signature != sig
        with pytest.raises(SchemaMismatchError):
            await p.inference.add_tenant(tenant_config("carol", tmp_path), foreign)
        with pytest.raises(InvalidRequestError, match="belongs to tenant"):
            await p.inference.add_tenant(tenant_config("carol", tmp_path), payload)

    with_plane(base, tmp_path, body)


def test_rollout_and_evaluation_run_at_the_pinned_version(base: AnyBase, tmp_path: Path) -> None:
    async def body(p: Plane) -> None:
        config = tenant_config(A, tmp_path, algo="ppo", value_head=True)
        sig = (await p.training.add_tenant(config)).schema_signature
        await p.inference.add_tenant(config)
        sid = (await p.env.create_session(A, ENV_SPEC)).session_id
        rollout = RolloutConfig(tenant_id=A, session_id=sid, schema_signature=sig, seed=1)
        stats = await p.inference.rollout(rollout, "job-1", "part", 2, 2, 0, heartbeat=lambda: None)
        assert stats.num_samples == 4 == p.queue.info("part").num_samples
        assert {"actions", "log_probs", "rewards"} <= set(p.queue.info("part").fields)
        with pytest.raises(ConflictError):
            await p.inference.rollout(rollout, "job-2", "part-2", 2, 2, 5)
        wrong = rollout.model_copy(update={"schema_signature": "sig-of-another-interface"})
        with pytest.raises(SchemaMismatchError):
            await p.inference.rollout(wrong, "job-3", "part-3", 2, 2, 0)
        result = await p.inference.evaluate(A, sid, episodes=2, seed=0, max_decisions=50)
        assert (result.tenant_id, result.version, result.episodes) == (A, 0, 2)
        assert result.versions_seen == {0} and 0.0 <= result.success_rate <= 1.0

    with_plane(base, tmp_path, body)
