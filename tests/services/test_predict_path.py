"""The lean predict path: one resolve, one validation, one lock, metered stages."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import numpy as np
import pytest

from joynexus.errors import SchemaMismatchError
from joynexus.metrics.events import MetricsService
from joynexus.metrics.stages import PER_BATCH_STAGES
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.schema import DataSchema
from joynexus.services.tenancy import backbone_lock
from tests.services.test_inference_service import SCHEMA, config, make_service


def test_a_request_is_resolved_and_validated_once(
    base: ResidentBaseModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    validations: list[int] = []
    real_validate = ObservationBatch.validate

    def counting_validate(self: ObservationBatch, schema: DataSchema) -> None:
        validations.append(self.batch_size)
        real_validate(self, schema)

    monkeypatch.setattr(ObservationBatch, "validate", counting_validate)

    async def main() -> None:
        async with make_service(base, max_batch_size=8, max_wait_s=0.05) as svc:
            await svc.add_tenant(config("a"))
            await svc.add_tenant(config("b"))
            resolved: list[str] = []
            real_slot = svc.states.slot

            def counting_slot(tenant_id: str, version: int | None = None) -> Any:
                resolved.append(tenant_id)
                return real_slot(tenant_id, version)

            monkeypatch.setattr(svc.states, "slot", counting_slot)
            obs = [
                ObservationBatch.synthetic(SCHEMA, n, seed=n, with_actions=False) for n in (1, 2)
            ]
            validations.clear()
            out = await asyncio.gather(svc.predict(obs[0], "a"), svc.predict(obs[1], "b"))
            assert [r.actions.shape for r in out] == [(1, 2, 2), (2, 2, 2)]
            assert svc.metrics.batches == 1  # both in one grouped batch
            assert sorted(resolved) == ["a", "b"]  # once each, at admission
            assert sorted(validations) == [1, 2]  # once each, never again in the batch

    asyncio.run(main())


def test_a_bad_request_fails_at_admission_and_never_reaches_the_queue(
    base: ResidentBaseModel,
) -> None:
    async def main() -> None:
        async with make_service(base) as svc:
            await svc.add_tenant(config("a"))
            good = ObservationBatch.synthetic(SCHEMA, 1, seed=0, with_actions=False)
            bad = dataclasses.replace(good, state=np.zeros((1, 5), dtype=np.float32))
            with pytest.raises(SchemaMismatchError, match="state"):
                await svc.predict(bad, "a")
            assert svc.metrics.requests == 0

    asyncio.run(main())


def test_the_batch_takes_the_backbone_lock_and_meters_its_wait(base: ResidentBaseModel) -> None:
    """One lock: while training holds the backbone's lock a batch waits for exactly it."""
    metrics = MetricsService()

    async def main() -> None:
        async with make_service(base, metrics=metrics) as svc:
            await svc.add_tenant(config("a"))
            obs = ObservationBatch.synthetic(SCHEMA, 1, seed=0, with_actions=False)
            lock = backbone_lock(base)
            held = threading.Event()
            release = threading.Event()

            def hold() -> None:
                with lock:
                    held.set()
                    release.wait(10)

            holder = threading.Thread(target=hold)
            holder.start()
            held.wait(10)
            task = asyncio.ensure_future(svc.predict(obs, "a"))
            await asyncio.sleep(0.2)
            assert not task.done()  # blocked on the one lock the trainer holds
            release.set()
            result = await task
            holder.join()
            assert result.actions.shape == (1, 2, 2)

    asyncio.run(main())
    stages = metrics.stages.snapshot()
    assert stages["lock_wait"][0] >= 0.1


def test_every_stage_is_metered_per_request_or_per_batch(base: ResidentBaseModel) -> None:
    metrics = MetricsService()

    async def main() -> None:
        async with make_service(base, metrics=metrics, max_batch_size=1) as svc:
            await svc.add_tenant(config("a"))
            obs = ObservationBatch.synthetic(SCHEMA, 1, seed=0, with_actions=False)
            for _ in range(3):
                await svc.predict(obs, "a")

    asyncio.run(main())
    stages = metrics.stages.snapshot()
    for stage in ("admission", "queue_wait", *sorted(PER_BATCH_STAGES)):
        seconds, count = stages[stage]
        assert count == 3, stage  # batch size 1: one batch per request
        assert seconds >= 0.0
    assert stages["backbone"][0] > 0.0 and stages["canonicalize"][0] > 0.0
    text = metrics.render_latest().decode()
    assert 'joynexus_predict_stage_events_total{stage="backbone"} 3.0' in text
