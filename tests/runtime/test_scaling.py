"""Elastic rollout-engine pool: scale out (sync + gradual admission), scale in (drain),
serialization and rollback, the autoscaling policy."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joynexus.errors import CapacityError, DeadlineExceededError, ServiceUnavailableError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.queues.training import TrainingQueue
from joynexus.runtime.autoscale import AutoscalePolicy, Autoscaler
from joynexus.runtime.scaling import EngineHandle, EnginePool
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.tenancy import TenantConfig
from joynexus.utils.clock import FakeClock
from tests.models.conftest import tiny_backbone, tiny_model_dir  # noqa: F401

SCHEMA = DataSchema(
    name="tiny",
    cameras={"cam": CameraSpec(height=32, width=32)},
    state_dim=3,
    action_dim=2,
    action_chunk=2,
    instruction="reach",
)


def tenant(tid: str, seed: int = 0) -> TenantConfig:
    return TenantConfig(
        tenant_id=tid,
        schema_=SCHEMA,
        head=OFTHeadConfig(hidden_dim=32, num_blocks=1),
        value_head=False,
        seed=seed,
        output_dir=Path("."),
    )


@pytest.fixture
def base(tiny_backbone: Any) -> ResidentBaseModel:  # noqa: F811
    backbone: ResidentBaseModel = tiny_backbone("qwen2_5_vl")
    return backbone


class Factory:
    """Builds real Inference Model Services; can be told to fail the next start."""

    def __init__(self, base: ResidentBaseModel) -> None:
        self.base = base
        self.env = EnvironmentService()
        self.queue = TrainingQueue()
        self.fail_next = False
        self.started: list[InferenceModelService] = []
        self.released: list[InferenceModelService] = []

    async def __call__(self, slot: int) -> EngineHandle:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("engine failed to start (injected)")
        engine = InferenceModelService(self.base, self.env, self.queue, max_wait_s=0.001)
        await engine.start()
        self.started.append(engine)

        async def release() -> None:
            self.released.append(engine)

        return EngineHandle(engine=engine, release=release)


def obs() -> ObservationBatch:
    return ObservationBatch.synthetic(SCHEMA, 2, seed=3, with_actions=False)


def test_scale_out_syncs_published_weights_and_admits_gradually(base: ResidentBaseModel) -> None:
    async def main() -> None:
        factory = Factory(base)
        pool = EnginePool(factory, max_engines=3, answers_per_step=1)
        await pool.start(1)
        await pool.add_tenant(tenant("a"))
        first = factory.started[0]
        weights = {n: t + 0.3 for n, t in first.serving_slot("a").state_tensors().items()}
        await pool.load_weights("a", 4, weights)
        reference = await pool.predict(obs(), "a")

        assert await pool.scale_out() == 2
        new = factory.started[1]
        # Synced: same version, same deterministic actions as the old engine.
        assert new.current_policy_version("a") == 4
        direct = await new.predict(obs(), "a")
        np.testing.assert_allclose(direct.actions, reference.actions, atol=1e-5)
        # Admitted gradually: starts below full weight, reaches it by answering calls.
        status = {s.engine_id: s for s in pool.status()}
        assert status[1].state == "warming" and status[1].weight == 0.25
        for _ in range(12):
            await asyncio.gather(*(pool.predict(obs(), "a") for _ in range(6)))
        status = {s.engine_id: s for s in pool.status()}
        assert status[1].state == "serving" and status[1].weight == 1.0
        assert status[1].answered > 0 and status[0].answered > status[1].answered
        # Weight broadcasts reach every engine.
        await pool.load_weights("a", 5, weights)
        assert {e.current_policy_version("a") for e in factory.started} == {5}
        with pytest.raises(CapacityError):
            await pool.scale_to(4)
        await pool.stop()

    asyncio.run(main())


def test_scale_out_failure_rolls_back(base: ResidentBaseModel) -> None:
    async def main() -> None:
        factory = Factory(base)
        pool = EnginePool(factory)
        await pool.start(1)
        await pool.add_tenant(tenant("a"))
        factory.fail_next = False
        # Two new engines asked; the second fails: the first must be released too.
        original = factory.__call__

        calls = 0

        async def flaky(slot: int) -> EngineHandle:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise RuntimeError("no accelerator left (injected)")
            return await original(slot)

        pool._factory = flaky
        with pytest.raises(ServiceUnavailableError, match="rolled back to 1"):
            await pool.scale_to(3)
        assert pool.size == 1 and pool.engine_ids() == [0]
        assert len(factory.released) == 1 and factory.released[0] is factory.started[1]
        assert not factory.started[1].inference_queue.running
        # The pool still serves.
        assert (await pool.predict(obs(), "a")).actions.shape == (2, 2, 2)
        await pool.stop()

    asyncio.run(main())


def test_scale_in_drains_outstanding_calls_before_release(base: ResidentBaseModel) -> None:
    async def main() -> None:
        factory = Factory(base)
        pool = EnginePool(factory)
        await pool.start(2)
        await pool.add_tenant(tenant("a"))
        slow = factory.started[1]
        gate = asyncio.Event()
        real_predict = slow.predict

        async def held(*args: Any, **kwargs: Any) -> Any:
            await gate.wait()
            return await real_predict(*args, **kwargs)

        slow.predict = held  # type: ignore[method-assign]
        # Two concurrent calls: least-outstanding dispatch puts one on each engine.
        calls = [asyncio.create_task(pool.predict(obs(), "a")) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert {s.engine_id: s.in_flight for s in pool.status()}[1] == 1
        scale = asyncio.create_task(pool.scale_in())
        await asyncio.sleep(0.05)
        assert not scale.done() and factory.released == []  # still draining
        assert {s.engine_id: s.state for s in pool.status()}[1] == "draining"
        # New calls avoid the draining engine.
        await pool.predict(obs(), "a")
        assert {s.engine_id: s.answered for s in pool.status()}[1] == 0
        gate.set()
        assert await scale == 1
        assert factory.released == [slow]
        results = await asyncio.gather(*calls)
        assert all(r.actions.shape == (2, 2, 2) for r in results)
        await pool.stop()

    asyncio.run(main())


def test_scale_in_that_cannot_drain_is_rolled_back(base: ResidentBaseModel) -> None:
    async def main() -> None:
        clock = FakeClock()
        factory = Factory(base)
        pool = EnginePool(factory, clock=clock, drain_timeout_s=5.0)
        await pool.start(2)
        await pool.add_tenant(tenant("a"))
        stuck = factory.started[1]
        never = asyncio.Event()

        async def hang(*args: Any, **kwargs: Any) -> Any:
            await never.wait()

        stuck.predict = hang  # type: ignore[method-assign]
        calls = [asyncio.create_task(pool.predict(obs(), "a")) for _ in range(2)]
        await asyncio.sleep(0.05)
        scale = asyncio.create_task(pool.scale_in())
        await asyncio.sleep(0.01)
        clock.advance(6.0)
        with pytest.raises(DeadlineExceededError, match="rolled back"):
            await scale
        assert pool.size == 2 and factory.released == []
        assert {s.state for s in pool.status()} <= {"serving", "warming"}
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await pool.stop()

    asyncio.run(main())


def test_scaling_operations_are_serialized(base: ResidentBaseModel) -> None:
    async def main() -> None:
        factory = Factory(base)
        inside = 0
        peak = 0
        original = factory.__call__

        async def tracked(slot: int) -> EngineHandle:
            nonlocal inside, peak
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.01)
            try:
                return await original(slot)
            finally:
                inside -= 1

        pool = EnginePool(tracked)
        await pool.start(1)
        sizes = await asyncio.gather(pool.scale_out(), pool.scale_out(), pool.scale_in())
        assert peak == 1
        assert sizes == [2, 3, 2]  # in call order, each relative to the previous one
        assert pool.size == 2
        await pool.stop()

    asyncio.run(main())


def test_autoscaler_follows_inference_pressure_and_is_off_by_default(
    base: ResidentBaseModel,
) -> None:
    async def main() -> None:
        clock = FakeClock()
        factory = Factory(base)
        pool = EnginePool(factory, clock=clock)
        await pool.start(1)
        assert AutoscalePolicy().enabled is False
        policy = AutoscalePolicy(
            enabled=True, max_engines=2, scale_out_above=2, scale_in_below=0.5, cooldown_s=10
        )
        scaler = Autoscaler(pool, policy, clock)
        pool._members[0].in_flight = 5  # pressure: 5 outstanding on 1 engine
        assert await scaler.step() == 2
        assert await scaler.step() == 2  # at max (and in cooldown)
        pool._members[0].in_flight = 0
        assert await scaler.step() == 2  # cooldown holds
        clock.advance(11)
        assert await scaler.step() == 1
        assert [(a, b) for _, a, b in scaler.decisions] == [(1, 2), (2, 1)]
        await pool.stop()

    asyncio.run(main())


def _declared_signature(method: Any) -> inspect.Signature:
    """The signature as the code declares it. Making a class a Ray actor (an earlier
    test in the same process may) sets ``__signature__`` on its methods' functions in
    place, adding Ray's keyword-only ``_ray_trace_ctx``; that parameter is Ray's, not
    ours, so it is left out."""
    sig = inspect.signature(method)
    return sig.replace(
        parameters=[p for p in sig.parameters.values() if p.name != "_ray_trace_ctx"]
    )


@pytest.mark.parametrize("name", ["predict", "rollout", "evaluate"])
def test_the_pools_dispatched_calls_are_the_protocols_and_the_engines_signature(
    name: str,
) -> None:
    """Written once: the pool derives its calls from the protocol, which must be the
    engine's own signature (a change to one that the other lacks fails here)."""
    from joynexus.services.protocols import InferenceModelServiceAPI

    protocol = inspect.signature(getattr(InferenceModelServiceAPI, name))
    assert _declared_signature(getattr(EnginePool, name)) == protocol
    assert _declared_signature(getattr(InferenceModelService, name)) == protocol
    assert inspect.iscoroutinefunction(getattr(EnginePool, name))
