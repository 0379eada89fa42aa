"""grouped_step: one forward, per-tenant failures, the gradient-reduce hook."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import pytest
import torch

from joynexus.errors import InvalidRequestError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.execution.grouped_step import (
    LocalLoss,
    LossFn,
    StepTimes,
    TenantStep,
    grouped_step,
)
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.types import BackboneOutput
from joynexus.utils.priority_lock import PriorityRLock
from tests.models.conftest import TinyBackbone
from tests.models.test_grouped import (
    LIB,
    OFT,
    PT,
    TENANTS,
    CountingBase,
    _batches,
    _executor,
)


@pytest.fixture
def base(tiny_backbone: TinyBackbone) -> ResidentBaseModel:
    return tiny_backbone("qwen2_5_vl")


def _sft(slot: TenantSlot, batch: ObservationBatch) -> LossFn:
    assert batch.actions is not None
    state, actions = torch.from_numpy(batch.state), torch.from_numpy(batch.actions)

    def loss(features: BackboneOutput) -> tuple[torch.Tensor, dict[str, float]]:
        return slot.loss(features, state, actions, None), {"n": 1.0}

    return loss


def test_a_failing_tenant_leaves_the_step_and_the_others_still_step(
    base: ResidentBaseModel,
) -> None:
    counting = CountingBase(base)
    ex = _executor(counting, {t: TENANTS[t] for t in ("lib", "pt")})
    batches = _batches({"lib": 2, "pt": 3})
    lib, pt = ex.slot("lib"), ex.slot("pt")

    def nan(features: BackboneOutput) -> tuple[torch.Tensor, dict[str, float]]:
        return features.hidden_states.sum() * float("nan"), {}

    steps = [
        TenantStep(lib, batches["lib"], nan),
        TenantStep(pt, batches["pt"], _sft(pt, batches["pt"])),
    ]
    before = [p.detach().clone() for p in pt.parameters()]
    lib_before = [p.detach().clone() for p in lib.parameters()]
    times = StepTimes()
    outcomes = grouped_step(
        steps, forward=ex.shared_forward, lock=threading.RLock(), isolate=True, times=times
    )
    assert counting.encoded_rows == [5]  # one forward for both tenants
    assert isinstance(outcomes[0], InvalidRequestError) and "refusing to step" in str(outcomes[0])
    assert not isinstance(outcomes[1], Exception)
    step, stats = outcomes[1]
    assert step.policy_version == 1 and stats == {"n": 1.0}
    assert lib.policy_version == 0
    assert all(torch.equal(a, b) for a, b in zip(lib_before, lib.parameters(), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(before, pt.parameters(), strict=True))
    assert times.rows == {"lib": 2, "pt": 3} and set(times.own_s) == {"lib", "pt"}

    # Not isolating: the error is raised once the others have stepped.
    with pytest.raises(InvalidRequestError):
        grouped_step(steps, forward=ex.shared_forward, lock=threading.RLock())
    assert pt.policy_version == 2 and lib.policy_version == 0


def test_the_reduce_hook_sees_every_tenant_and_sets_the_step(base: ResidentBaseModel) -> None:
    ex = _executor(base, {"lib": (LIB, OFT), "pt": (PT, OFT)})
    batches = _batches({"lib": 2, "pt": 2})
    lib, pt = ex.slot("lib"), ex.slot("pt")
    seen: list[tuple[str, LocalLoss | Exception | None]] = []

    def reduce(
        slot: TenantSlot, local: LocalLoss | Exception | None
    ) -> tuple[float, dict[str, float]] | Exception:
        seen.append((slot.tenant_id, local))
        if local is None:  # no rows here: another process's gradients would arrive
            for p in slot.parameters():
                p.grad = torch.zeros_like(p)
            return 0.5, {"reduced": 1.0}
        assert isinstance(local, LocalLoss)
        return local.value, local.stats

    steps = [
        TenantStep(lib, batches["lib"], _sft(lib, batches["lib"]), weight=0.5),
        TenantStep(pt, None, _sft(pt, batches["pt"])),
    ]
    outcomes = grouped_step(steps, forward=ex.shared_forward, lock=threading.RLock(), reduce=reduce)
    assert [t for t, _ in seen] == ["lib", "pt"]
    local = seen[0][1]
    assert isinstance(local, LocalLoss) and local.weight == 0.5
    lib_step = outcomes[0]
    assert not isinstance(lib_step, Exception)
    assert lib_step[0].loss == pytest.approx(local.value)
    pt_step = outcomes[1]
    assert not isinstance(pt_step, Exception)
    assert pt_step[0].loss == 0.5 and pt_step[1] == {"reduced": 1.0}
    assert seen[1][1] is None and pt.policy_version == 1


def test_a_predict_arriving_during_the_forward_runs_before_the_losses(
    base: ResidentBaseModel,
) -> None:
    ex = _executor(base, {"pt": TENANTS["pt"]})
    batches = _batches({"pt": 2})
    slot = ex.slot("pt")
    lock = PriorityRLock()
    order: list[str] = []
    predict: list[threading.Thread] = []

    def predict_batch() -> None:
        with lock.priority():
            order.append("predict")

    def forward(
        batches: Mapping[str, ObservationBatch], *, grad: bool, validated: bool
    ) -> dict[str, BackboneOutput]:
        out = ex.shared_forward(batches, grad=grad, validated=validated)
        order.append("forward")
        predict.append(threading.Thread(target=predict_batch, daemon=True))
        predict[0].start()
        for _ in range(10_000):  # until the predict is parked on the lock
            if lock.priority_waiting:
                break
            threading.Event().wait(0.001)
        return out

    sft = _sft(slot, batches["pt"])

    def loss(features: BackboneOutput) -> tuple[torch.Tensor, dict[str, float]]:
        order.append("loss")
        return sft(features)

    outcomes = grouped_step([TenantStep(slot, batches["pt"], loss)], forward=forward, lock=lock)
    predict[0].join(10.0)
    assert order == ["forward", "predict", "loss"]  # it waited one phase, not the step
    assert not isinstance(outcomes[0], Exception) and slot.policy_version == 1
