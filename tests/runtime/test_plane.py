"""The execution plane by placement: protocols, lifecycle, scaling and health wiring.

Planes are built on the tiny backbone with the in-process placements (the Ray placement
runs in test_ray_runtime.py / test_ray_serve.py). That every placement's services
satisfy the protocols is proved statically: ``mypy src/joynexus`` checks the
assignments the placements make (no casts); the test below checks the run-time half of
the Ray proxy's claim (each protocol member keeps its kind on the service class).
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joynexus.errors import ConflictError, ServiceUnavailableError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.queues.training import TrainingQueue
from joynexus.runtime.health import HealthManager
from joynexus.runtime.hosting import EnginePoolPlacement, InProcess, Placement
from joynexus.runtime.plane import ExecutionPlane, RuntimeConfig, build_plane, watch_plane
from joynexus.runtime.scaling import EnginePool
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.protocols import (
    EnvironmentServiceAPI,
    InferenceModelServiceAPI,
    TrainingModelServiceAPI,
    TrainingQueueAPI,
)
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import BaseModelSpec
from joynexus.utils.clock import FakeClock
from tests.models.conftest import tiny_backbone, tiny_model_dir  # noqa: F401
from tests.runtime.test_scaling import obs, tenant

PROTOCOLS: list[tuple[type, type]] = [
    (TrainingModelServiceAPI, TrainingModelService),
    (InferenceModelServiceAPI, InferenceModelService),
    (EnvironmentServiceAPI, EnvironmentService),
    (TrainingQueueAPI, TrainingQueue),
]


def _members(protocol: type) -> dict[str, Any]:
    skip = {"__init__", "__subclasshook__", "__class_getitem__", "__init_subclass__"}
    return {
        name: member
        for name, member in vars(protocol).items()
        if not name.startswith("_") and name not in skip
    }


def _kind(member: Any) -> str:
    if isinstance(member, property):
        return "property"
    return "coroutine" if inspect.iscoroutinefunction(member) else "method"


@pytest.mark.parametrize(("protocol", "cls"), PROTOCOLS, ids=lambda p: p.__name__)
def test_every_protocol_member_keeps_its_kind_on_the_service_class(
    protocol: type, cls: type
) -> None:
    # An ActorProxy turns a coroutine into an awaited ObjectRef, a plain method into a
    # blocking call and a property into a read: right iff the class agrees with the
    # protocol on each member's kind.
    members = _members(protocol)
    assert members, protocol
    for name, member in members.items():
        assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
        assert _kind(inspect.getattr_static(cls, name)) == _kind(member), (cls, name)
    # The pool stands in for one engine: same kinds.
    if protocol is InferenceModelServiceAPI:
        for name, member in members.items():
            assert _kind(inspect.getattr_static(EnginePool, name)) == _kind(member), name


@pytest.fixture
def base(tiny_backbone: Any) -> ResidentBaseModel:  # noqa: F811
    backbone: ResidentBaseModel = tiny_backbone("qwen2_5_vl")
    return backbone


def _plane(tmp_path: Path, base: ResidentBaseModel, placement: Placement) -> ExecutionPlane:
    return build_plane(
        tmp_path / "run",
        BaseModelSpec(id="tiny:qwen2_5_vl"),
        placement=placement,
        config=RuntimeConfig(max_wait_s=0.001),
        base=base,
    )


async def _serve_two_tenants(plane: ExecutionPlane) -> dict[str, Any]:
    """Serve tenants a (v3) and b (v7) with perturbed weights; their mean actions."""
    await plane.inference.add_tenant(tenant("a"))
    await plane.inference.add_tenant(tenant("b", seed=1))
    for tid, v in (("a", 3), ("b", 7)):
        engine = plane.pool.engine(0) if plane.pool is not None else plane.inference
        assert isinstance(engine, InferenceModelService)
        weights = {n: t * 1.5 for n, t in engine.serving_slot(tid).state_tensors().items()}
        await plane.inference.load_weights(tid, v, weights)
    return {tid: await plane.inference.predict(obs(), tid) for tid in ("a", "b")}


@pytest.mark.parametrize(
    "placement", [InProcess(), EnginePoolPlacement(engines=1, max_engines=2)], ids=repr
)
def test_planes_place_the_services_and_own_their_lifecycle(
    tmp_path: Path, base: ResidentBaseModel, placement: Placement
) -> None:
    async def main() -> None:
        plane = _plane(tmp_path, base, placement)
        assert isinstance(plane.training, TrainingModelService)
        assert isinstance(plane.env, EnvironmentService)
        assert isinstance(plane.queue, TrainingQueue)
        if isinstance(placement, InProcess):
            assert plane.pool is None and isinstance(plane.inference, InferenceModelService)
        else:
            assert plane.pool is plane.inference and isinstance(plane.pool, EnginePool)
        await plane.start()
        try:
            before = await _serve_two_tenants(plane)
            assert plane.inference.current_policy_version("b") == 7
            assert plane.inference.metrics.completed >= 2
            if plane.pool is None:
                with pytest.raises(ConflictError, match="EnginePoolPlacement"):
                    await plane.scale_rollout(2)
                with pytest.raises(ConflictError):
                    plane.engine_status()
            else:
                assert await plane.scale_rollout(2) == 2
                second = plane.pool.engine(plane.pool.engine_ids()[1])
                assert second.current_policy_version("a") == 3  # synced on admission
                direct = await second.predict(obs(), "a")
                np.testing.assert_allclose(direct.actions, before["a"].actions, atol=1e-5)
                assert [s.state for s in plane.engine_status()] == ["serving", "warming"]
                assert await plane.scale_rollout(1) == 1
                assert plane.inference.metrics.completed >= 2
        finally:
            await plane.stop()
            plane.close()
        if plane.pool is not None:
            assert plane.pool.size == 0
        else:
            assert isinstance(plane.inference, InferenceModelService)
            assert not plane.inference.inference_queue.running

    asyncio.run(main())


def test_health_wiring_restarts_a_stopped_in_process_engine(
    tmp_path: Path, base: ResidentBaseModel
) -> None:
    async def main() -> None:
        plane = _plane(tmp_path, base, InProcess())
        hm = HealthManager(FakeClock(), heartbeat_timeout_s=None)
        watch_plane(hm, plane, session_holders=list)
        assert set(hm.roles()) == {"environment", "inference", "training"}
        await plane.start()
        try:
            before = await _serve_two_tenants(plane)
            engine = plane.inference
            assert isinstance(engine, InferenceModelService)
            await engine.stop()  # the role dies
            with pytest.raises(ServiceUnavailableError):
                await engine.predict(obs(), "a")
            await hm.check()
            assert [e.kind for e in hm.events_of("inference")][-2:] == [
                "restart_started",
                "restarted",
            ]
            assert engine.inference_queue.running and hm.escalated is None
            for tid, v in (("a", 3), ("b", 7)):  # slots and weights survived the restart
                after = await engine.predict(obs(), tid)
                assert after.policy_version == v
                np.testing.assert_array_equal(after.actions, before[tid].actions)
        finally:
            await plane.stop()
            plane.close()

    asyncio.run(main())


def test_health_wiring_restarts_a_pool_engine_and_follows_scaling(
    tmp_path: Path, base: ResidentBaseModel
) -> None:
    async def main() -> None:
        plane = _plane(tmp_path, base, EnginePoolPlacement(engines=1, max_engines=2))
        pool = plane.pool
        assert pool is not None
        hm = HealthManager(FakeClock(), heartbeat_timeout_s=None)
        watch_plane(hm, plane, session_holders=list)  # before start: roles follow the pool
        assert "inference/0" not in hm.roles()
        await plane.start()
        try:
            assert set(hm.roles()) == {"environment", "inference/0", "training"}
            before = await _serve_two_tenants(plane)
            old = pool.engine(0)
            await old.stop()  # the role dies; the next call reports it
            with pytest.raises(ServiceUnavailableError):
                await plane.inference.predict(obs(), "a")
            for _ in range(50):
                await asyncio.sleep(0.01)
                if hm.events_of("inference/0")[-1].kind == "restarted":
                    break
            assert hm.events_of("inference/0")[-1].kind == "restarted"
            new = pool.engine(0)
            assert new is not old
            for tid, v in (("a", 3), ("b", 7)):  # re-synced to the published weights
                after = await plane.inference.predict(obs(), tid)
                assert after.policy_version == v
                np.testing.assert_array_equal(after.actions, before[tid].actions)
            await plane.scale_rollout(2)
            assert "inference/1" in hm.roles()
            await plane.scale_rollout(1)
            assert "inference/1" not in hm.roles() and "inference/0" in hm.roles()
        finally:
            await plane.stop()
            plane.close()

    asyncio.run(main())


def test_training_role_escalates_unless_a_restart_is_given(
    tmp_path: Path, base: ResidentBaseModel
) -> None:
    async def main() -> None:
        plane = _plane(tmp_path, base, InProcess())
        try:
            hm = HealthManager(FakeClock(), heartbeat_timeout_s=None)
            watch_plane(hm, plane, session_holders=list)
            assert not await hm.report_error("training", "optimizer state lost")
            assert hm.escalated is not None and "training" in hm.escalated

            restarts: list[bool] = []

            async def restart_training() -> None:
                restarts.append(True)

            hm2 = HealthManager(FakeClock(), heartbeat_timeout_s=None)
            watch_plane(hm2, plane, session_holders=list, restart_training=restart_training)
            assert await hm2.report_error("training", "optimizer state lost")
            assert restarts == [True] and hm2.escalated is None
        finally:
            plane.close()

    asyncio.run(main())


def test_an_inference_copy_has_its_own_backbone_and_lock(
    tmp_path: Path, base: ResidentBaseModel
) -> None:
    """``inference_backbone="copy"``: inference runs on its own resident copy (loaded
    from the model spec), so holding the training backbone's lock never blocks a
    predict; published weights serve the same actions as on the shared backbone."""
    from joynexus.services.tenancy import backbone_lock

    async def main() -> None:
        shared = _plane(tmp_path / "shared", base, InProcess())
        plane = build_plane(
            tmp_path / "copy" / "run",
            BaseModelSpec(id="tiny:qwen2_5_vl"),
            config=RuntimeConfig(max_wait_s=0.001, inference_backbone="copy"),
            base=base,
        )
        try:
            assert isinstance(plane.inference, InferenceModelService)
            assert isinstance(shared.inference, InferenceModelService)
            assert shared.inference.base is base
            assert plane.inference.base is not base
            assert backbone_lock(plane.inference.base) is not backbone_lock(base)
            await shared.start()
            await plane.start()
            with backbone_lock(base):  # the training role busy on its backbone
                answers = await asyncio.wait_for(_serve_two_tenants(plane), timeout=60)
            reference = await _serve_two_tenants(shared)
            for tid in ("a", "b"):
                np.testing.assert_allclose(answers[tid].actions, reference[tid].actions, atol=1e-5)
        finally:
            for p in (plane, shared):
                await p.stop()
                p.close()

    asyncio.run(main())
