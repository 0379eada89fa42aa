"""Inference Model Service: versioned serving, pinning, group batching, evaluation."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from joynexus.envs.base import EnvSpec
from joynexus.errors import ConflictError, InvalidRequestError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.tenancy import TenantConfig
from tests.utils.blas import thread_blas_threads

SCHEMA = DataSchema(
    name="tiny",
    cameras={"cam": CameraSpec(height=32, width=32)},
    state_dim=3,
    action_dim=2,
    action_chunk=2,
    instruction="do the fake thing",
)
OFT = OFTHeadConfig(hidden_dim=32, num_blocks=1)


def config(tid: str, schema: DataSchema = SCHEMA, seed: int = 0) -> TenantConfig:
    return TenantConfig(
        tenant_id=tid, schema_=schema, head=OFT, value_head=True, seed=seed, output_dir=Path(".")
    )


def perturbed(svc: InferenceModelService, tid: str) -> dict[str, torch.Tensor]:
    return {n: t + 0.5 for n, t in svc.serving_slot(tid).state_tensors().items()}


def make_service(base: ResidentBaseModel, **kw: Any) -> InferenceModelService:
    return InferenceModelService(base, EnvironmentService(), TrainingQueue(), **kw)


def test_pinned_version_keeps_serving_while_a_new_one_is_published(
    base: ResidentBaseModel,
) -> None:
    async def main() -> None:
        async with make_service(base, max_batch_size=1) as svc:
            await svc.add_tenant(config("a"))
            obs = ObservationBatch.synthetic(SCHEMA, 2, seed=0, with_actions=False)
            before = await svc.predict(obs, "a")
            assert before.policy_version == 0 and before.actions.shape == (2, 2, 2)
            with svc.pinned("a") as v:
                assert v == 0
                await svc.load_weights("a", 1, perturbed(svc, "a"))
                assert svc.current_policy_version("a") == 1
                old = await svc.predict(obs, "a", v)
                new = await svc.predict(obs, "a")
                assert old.policy_version == 0 and new.policy_version == 1
                np.testing.assert_array_equal(old.actions, before.actions)
                assert not np.allclose(new.actions, before.actions)
                assert svc.states.held_versions("a") == [0, 1]
            assert svc.states.held_versions("a") == [1]
            with pytest.raises(ConflictError, match="version 0 is not served"):
                await svc.predict(obs, "a", 0)

    asyncio.run(main())


def test_load_weights_validates_names_shapes_and_order(base: ResidentBaseModel) -> None:
    async def main() -> None:
        async with make_service(base) as svc:
            await svc.add_tenant(config("a"))
            tensors = perturbed(svc, "a")
            bad_shape = dict(tensors)
            bad_shape["action_module.log_std"] = torch.zeros(5)
            with pytest.raises(InvalidRequestError, match=r"log_std: expected shape \[2\]"):
                await svc.load_weights("a", 1, bad_shape)
            missing = {k: v for k, v in tensors.items() if not k.startswith("value_head.")}
            with pytest.raises(InvalidRequestError, match="missing"):
                await svc.load_weights("a", 1, missing)
            assert svc.current_policy_version("a") == 0
            await svc.load_weights("a", 3, tensors)
            with pytest.raises(ConflictError, match="already served"):
                await svc.load_weights("a", 2, tensors)

    asyncio.run(main())


def test_two_tenants_concurrent_predicts_share_one_batch(base: ResidentBaseModel) -> None:
    other = SCHEMA.model_copy(update={"action_dim": 3, "state_dim": 4})

    async def main() -> None:
        obs_a = ObservationBatch.synthetic(SCHEMA, 1, seed=1, with_actions=False)
        obs_b = ObservationBatch.synthetic(other, 2, seed=2, with_actions=False)
        # B = 3 samples and a long T: the batch fires exactly when both requests are in.
        async with make_service(base, max_batch_size=3, max_wait_s=60.0) as svc:
            await svc.add_tenant(config("a"))
            await svc.add_tenant(config("b", other, seed=1))
            ra, rb = await asyncio.gather(svc.predict(obs_a, "a"), svc.predict(obs_b, "b"))
            metrics = svc.metrics
            assert metrics.batches == 1 and metrics.batch_size_histogram == {3: 1}
        assert ra.actions.shape == (1, 2, 2) and rb.actions.shape == (2, 2, 3)
        assert rb.values is not None and rb.values.shape == (2,)
        async with make_service(base, max_batch_size=1) as alone:
            await alone.add_tenant(config("a"))
            await alone.add_tenant(config("b", other, seed=1))
            sa = await alone.predict(obs_a, "a")
            sb = await alone.predict(obs_b, "b")
        np.testing.assert_allclose(ra.actions, sa.actions, atol=1e-5)
        np.testing.assert_allclose(rb.actions, sb.actions, atol=1e-5)

    asyncio.run(main())


def test_sample_mode_returns_log_probs(base: ResidentBaseModel) -> None:
    async def main() -> None:
        async with make_service(base, max_batch_size=1) as svc:
            await svc.add_tenant(config("a"))
            obs = ObservationBatch.synthetic(SCHEMA, 2, seed=0, with_actions=False)
            mean = await svc.predict(obs, "a")
            drawn = await svc.predict(obs, "a", mode="sample")
            assert mean.log_probs is None
            assert drawn.log_probs is not None and drawn.log_probs.shape == (2,)
            assert not np.allclose(mean.actions, drawn.actions)

    asyncio.run(main())


def test_evaluation_stays_on_its_version_while_training_publishes(
    base: ResidentBaseModel,
) -> None:
    async def main() -> None:
        env = EnvironmentService()
        svc = InferenceModelService(base, env, TrainingQueue(), max_batch_size=2)
        spec = EnvSpec(kind="fake", num_envs=2, image_size=32, options={"episode_len": 3})
        try:
            await svc.start()
            session = await env.create_session("evaluator", spec)
            schema = session.schema.model_copy(update={"action_chunk": 1})
            await svc.add_tenant(config("a", schema))

            async def publish_mid_run() -> None:
                while svc.metrics.completed < 1:
                    await asyncio.sleep(0.001)
                await svc.load_weights("a", 1, perturbed(svc, "a"))

            result, _ = await asyncio.gather(
                svc.evaluate(
                    "a", session.session_id, episodes=4, session_tenant="evaluator", seed=0
                ),
                publish_mid_run(),
            )
            assert result.version == 0 and result.versions_seen == {0}
            assert result.episodes == 4 and 0.0 <= result.success_rate <= 1.0
            assert svc.metrics.completed >= 6  # 2 episodes per env of 3 steps each
            assert svc.current_policy_version("a") == 1
            assert svc.states.held_versions("a") == [1]
        finally:
            await svc.stop()
            await env.aclose()

    asyncio.run(main())


def test_load_weights_refuses_non_finite_tensors(base: ResidentBaseModel) -> None:
    async def main() -> None:
        async with make_service(base, max_batch_size=1) as svc:
            await svc.add_tenant(config("a"))
            tensors = perturbed(svc, "a")
            name = next(n for n, t in tensors.items() if t.is_floating_point())
            for bad_value in (float("nan"), float("inf")):
                bad = dict(tensors)
                bad[name] = tensors[name].clone().flatten()
                bad[name][0] = bad_value
                bad[name] = bad[name].reshape(tensors[name].shape)
                with pytest.raises(InvalidRequestError, match=rf"named_tensors\['{name}'\]"):
                    await svc.load_weights("a", 1, bad)
            assert svc.current_policy_version("a") == 0  # nothing was published
            obs = ObservationBatch.synthetic(SCHEMA, 1, seed=0, with_actions=False)
            assert np.isfinite((await svc.predict(obs, "a")).actions).all()

    asyncio.run(main())


def test_a_non_finite_prediction_fails_that_request_alone(base: ResidentBaseModel) -> None:
    other = SCHEMA.model_copy(update={"action_dim": 3, "state_dim": 4})

    async def main() -> None:
        huge = ObservationBatch.synthetic(SCHEMA, 1, seed=1, with_actions=False)
        huge = dataclasses.replace(huge, state=np.full_like(huge.state, 3e38))
        fine = ObservationBatch.synthetic(other, 2, seed=2, with_actions=False)
        # One grouped batch: B = 3 samples and a long T (it fires when both are in).
        async with make_service(base, max_batch_size=3, max_wait_s=60.0) as svc:
            await svc.add_tenant(config("a"))
            await svc.add_tenant(config("b", other, seed=1))
            ra, rb = await asyncio.gather(
                svc.predict(huge, "a"), svc.predict(fine, "b"), return_exceptions=True
            )
            assert svc.metrics.batches >= 1
        assert isinstance(ra, InvalidRequestError), ra
        assert "NaN or infinite actions" in ra.message and ra.details["field"] == "actions"
        assert not isinstance(rb, BaseException)
        assert rb.actions.shape == (2, 2, 3) and np.isfinite(rb.actions).all()
        async with make_service(base, max_batch_size=1) as alone:
            await alone.add_tenant(config("b", other, seed=1))
            sb = await alone.predict(fine, "b")
        np.testing.assert_allclose(rb.actions, sb.actions, atol=1e-5)

    asyncio.run(main())


def test_a_publication_goes_at_a_training_steps_next_phase_not_after_the_step(
    base: ResidentBaseModel,
) -> None:
    """A step holds the backbone lock and yields to priority acquirers between phases:
    a publication issued during the step lands at that yield, while the step still runs
    (its commit then never delays the tenant's next step)."""
    import threading

    from joynexus.services.tenancy import backbone_lock

    lock = backbone_lock(base)
    holding, publishing, finish = threading.Event(), threading.Event(), threading.Event()

    def step() -> None:  # a training step: ordinary holder, yields between its phases
        with lock:
            holding.set()
            publishing.wait(timeout=30)
            while lock.priority_waiting == 0 and not finish.is_set():
                finish.wait(0.001)
            lock.yield_to_priority()  # its phase boundary
            finish.wait(timeout=30)  # the rest of the step

    async def main() -> None:
        async with make_service(base, max_batch_size=1) as svc:
            await svc.add_tenant(config("a"))
            worker = threading.Thread(target=step)
            worker.start()
            try:
                assert await asyncio.to_thread(holding.wait, 30)
                publishing.set()
                await asyncio.wait_for(svc.load_weights("a", 1, perturbed(svc, "a")), 10)
                assert svc.current_policy_version("a") == 1
                assert worker.is_alive()  # the step had not ended: the lock is still its
            finally:
                finish.set()
                await asyncio.to_thread(worker.join, 30)

    asyncio.run(main())


def test_a_publication_reuses_the_freed_slot_unless_something_still_holds_it(
    base: ResidentBaseModel,
) -> None:
    """The version freed by a publication is written by the next one, without the
    backbone lock; a slot a batch or rollout still holds is never written."""
    import threading
    import weakref

    from joynexus.services.tenancy import backbone_lock

    lock = backbone_lock(base)

    async def main() -> None:
        async with make_service(base, max_batch_size=1) as svc:
            await svc.add_tenant(config("a"))
            v0 = svc.serving_slot("a")
            v0_weights = {n: t.clone() for n, t in v0.state_tensors().items()}
            held = v0  # a queued request that resolved version 0 keeps it
            await svc.load_weights("a", 1, perturbed(svc, "a"))
            v1 = svc.serving_slot("a")
            assert v1 is not v0
            payload2 = perturbed(svc, "a")
            await svc.load_weights("a", 2, payload2)
            v2 = svc.serving_slot("a")
            assert v2 is not held, "a slot still held was written"
            for name, t in held.state_tensors().items():
                assert torch.equal(t, v0_weights[name]), name
            assert held.policy_version == 0
            del held, v0
            # Version 1 was freed with nothing else holding it: version 3 goes into it,
            # while a training step holds the backbone lock (no lock is taken).
            v1_ref = weakref.ref(v1)
            del v1
            payload3 = perturbed(svc, "a")
            stepping, done = threading.Event(), threading.Event()

            def step() -> None:
                with lock:
                    stepping.set()
                    done.wait(30)

            worker = threading.Thread(target=step)
            worker.start()
            try:
                assert await asyncio.to_thread(stepping.wait, 30)
                await asyncio.wait_for(svc.load_weights("a", 3, payload3), 10)
            finally:
                done.set()
                await asyncio.to_thread(worker.join, 30)
            v3 = svc.serving_slot("a")
            assert v3 is v1_ref() and v3.policy_version == 3
            for name, t in v3.state_tensors().items():
                assert torch.equal(t, payload3[name]), name
            # It serves what was published, in the same units as a fresh slot.
            obs = ObservationBatch.synthetic(SCHEMA, 2, seed=0, with_actions=False)
            assert (await svc.predict(obs, "a")).policy_version == 3

    asyncio.run(main())


def _record_blas_threads(svc: InferenceModelService, seen: list[int | None]) -> None:
    """Record MKL's thread count for the calling thread at each backbone forward."""
    encode = svc._executor._encode

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(thread_blas_threads())
        return encode(*args, **kwargs)

    svc._executor._encode = spy  # type: ignore[method-assign]


@pytest.mark.skipif(thread_blas_threads() is None, reason="torch without MKL")
def test_a_lone_requests_forward_keeps_mkls_threads_and_a_shared_batchs_runs_them_serial(
    base: ResidentBaseModel,
) -> None:
    """A serial-sized forward: MKL's products split only when nothing else waits (beside
    a busy core, split products wait for it)."""
    seen: list[int | None] = []

    async def main() -> None:
        obs = ObservationBatch.synthetic(SCHEMA, 1, seed=1, with_actions=False)
        async with make_service(base, max_batch_size=2, max_wait_s=60.0) as svc:
            await svc.add_tenant(config("a"))
            await svc.add_tenant(config("b", seed=1))
            _record_blas_threads(svc, seen)
            await asyncio.gather(svc.predict(obs, "a"), svc.predict(obs, "b"))  # one batch
        async with make_service(base, max_wait_s=0.0) as alone:
            await alone.add_tenant(config("a"))
            _record_blas_threads(alone, seen)
            await alone.predict(obs, "a")

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        asyncio.run(main())
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 2]
