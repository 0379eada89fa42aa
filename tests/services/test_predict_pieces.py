"""One predict cannot hold the shared backbone (issue 28 item 2): a request of more rows
than the batcher's B runs as B-row pieces that other tenants' requests interleave
with, its answer is the same as unsplit, and every request has a queue deadline."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from joynexus.errors import DeadlineExceededError, InvalidRequestError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from tests.services.test_inference_service import SCHEMA, config


def _service(base: ResidentBaseModel, deadline_s: float | None = 60.0) -> InferenceModelService:
    return InferenceModelService(
        base,
        EnvironmentService(),
        TrainingQueue(),
        max_batch_size=4,
        max_wait_s=0.0,
        request_deadline_s=deadline_s,
    )


def test_a_big_predict_runs_in_pieces_and_others_run_between_them(
    base: ResidentBaseModel,
) -> None:
    async def main() -> None:
        async with _service(base) as svc:
            await svc.add_tenant(config("big"))
            await svc.add_tenant(config("small", seed=1))
            obs = ObservationBatch.synthetic(SCHEMA, 12, seed=0, with_actions=False)
            whole = await svc.predict(obs, "big")
            assert whole.actions.shape == (12, 2, 2) and whole.values is not None
            # The pieces' answers, joined, are the rows' own answers.
            for start in range(0, 12, 4):
                rows = ObservationBatch.synthetic(SCHEMA, 12, seed=0, with_actions=False)
                part = ObservationBatch(
                    cameras={k: v[start : start + 4] for k, v in rows.cameras.items()},
                    state=rows.state[start : start + 4],
                    instructions=rows.instructions[start : start + 4],
                )
                alone = await svc.predict(part, "big")
                np.testing.assert_allclose(
                    whole.actions[start : start + 4], alone.actions, rtol=1e-4, atol=1e-5
                )
            batches = svc.metrics.batches
            # 12 rows with B = 4: three batches, not one oversize batch.
            assert batches == 3 + 3, svc.metrics

            big = asyncio.ensure_future(svc.predict(obs, "big"))
            await asyncio.sleep(0)  # its three pieces are queued first
            one = ObservationBatch.synthetic(SCHEMA, 1, seed=2, with_actions=False)
            small = await svc.predict(one, "small")
            assert small.actions.shape == (1, 2, 2)
            # The small tenant's request ran before the big request's last pieces.
            assert not big.done()
            assert (await big).actions.shape == (12, 2, 2)

    asyncio.run(main())


def test_every_predict_has_a_queue_deadline(base: ResidentBaseModel) -> None:
    async def main() -> None:
        async with _service(base, deadline_s=0.0) as svc:
            await svc.add_tenant(config("a"))
            obs = ObservationBatch.synthetic(SCHEMA, 2, seed=0, with_actions=False)
            with pytest.raises(DeadlineExceededError, match=r"past its deadline of 0\.0s"):
                await svc.predict(obs, "a")

    asyncio.run(main())


def test_pieces_of_tenant_batch_rows_answer_as_the_unsplit_predict(
    base: ResidentBaseModel,
) -> None:
    """Issue 43 item 6: a predict split into C-row pieces (C below B) answers exactly
    what one unsplit forward answers, rows in order, and takes one piece per batch."""

    async def main() -> None:
        obs = ObservationBatch.synthetic(SCHEMA, 10, seed=3, with_actions=False)
        whole = InferenceModelService(
            base, EnvironmentService(), TrainingQueue(), max_batch_size=16, max_wait_s=0.0
        )
        async with whole:
            await whole.add_tenant(config("big"))
            unsplit = await whole.predict(obs, "big")
            assert whole.metrics.batches == 1
        split = InferenceModelService(
            base,
            EnvironmentService(),
            TrainingQueue(),
            max_batch_size=16,
            max_wait_s=0.0,
            tenant_batch_rows=3,
        )
        async with split:
            await split.add_tenant(config("big"))
            pieces = await split.predict(obs, "big")
            assert split.metrics.batches == 4  # 3 + 3 + 3 + 1 rows, one piece per batch
        assert pieces.policy_version == unsplit.policy_version
        np.testing.assert_allclose(pieces.actions, unsplit.actions, rtol=1e-5, atol=1e-6)
        assert unsplit.values is not None and pieces.values is not None
        np.testing.assert_allclose(pieces.values, unsplit.values, rtol=1e-5, atol=1e-6)

    asyncio.run(main())


def test_a_bad_tenant_batch_rows_is_refused(base: ResidentBaseModel) -> None:
    with pytest.raises(InvalidRequestError, match="tenant_batch_rows"):
        InferenceModelService(base, EnvironmentService(), TrainingQueue(), tenant_batch_rows=0)
