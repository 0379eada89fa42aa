"""GroupedExecutor: one shared forward, per-tenant isolation, inference batch function."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from joynexus.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    SchemaMismatchError,
)
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.feature import VLAFeature
from joynexus.models.execution import grouped as grouped_module
from joynexus.models.execution.grouped import (
    GroupedExecutor,
    ServeRequest,
    StageTimes,
    resident_bytes,
)
from joynexus.models.policies import FlowMatchingHeadConfig, OFTHeadConfig, ValueHeadConfig
from joynexus.models.schema import CALVIN, LIBERO, PUSHT, CameraSpec, DataSchema
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.types import BackboneOutput
from joynexus.utils.priority_lock import PriorityRLock
from tests.models.conftest import TinyBackbone
from tests.models.reference import grouped_predict, serial_predict

OFT = OFTHeadConfig(hidden_dim=32, num_blocks=1)
FM = FlowMatchingHeadConfig(hidden_dim=32, num_layers=1, num_heads=2, num_inference_steps=3)


def _small(schema: DataSchema, side: int = 24) -> DataSchema:
    cams = {n: CameraSpec(height=side, width=side) for n in schema.cameras}
    return schema.model_copy(update={"cameras": cams})


LIB, CAL, PT = _small(LIBERO), _small(CALVIN), _small(PUSHT)


@pytest.fixture
def base(tiny_backbone: TinyBackbone) -> ResidentBaseModel:
    return tiny_backbone("qwen2_5_vl")


class CountingBase:
    """The real backbone, counting its shared forwards (delegates everything)."""

    def __init__(self, inner: ResidentBaseModel):
        self.inner = inner
        self.model_id = inner.model_id
        self.hidden_size = inner.hidden_size
        self.device = inner.device
        self.encoded_rows: list[int] = []

    def signature_for(self, schema: DataSchema) -> str:
        return self.inner.signature_for(schema)

    def canonicalize(
        self, groups: list[tuple[str, DataSchema, ObservationBatch]], *, validated: bool = False
    ) -> VLAFeature:
        return self.inner.canonicalize(groups, validated=validated)

    def encode(self, feature: VLAFeature) -> BackboneOutput:
        self.encoded_rows.append(feature.batch_size)
        return self.inner.encode(feature)

    def parameter_bytes(self) -> int:
        return self.inner.parameter_bytes()

    def forward_splits(self, feature: VLAFeature) -> bool:
        return self.inner.forward_splits(feature)

    def forward_took(self, feature: VLAFeature, split: bool, seconds: float) -> None:
        self.inner.forward_took(feature, split, seconds)


def _executor(base: object, heads: dict[str, tuple[DataSchema, object]]) -> GroupedExecutor:
    slots = [
        # Seeded by name so a tenant starts identical in every executor it joins.
        TenantSlot(tid, schema, base, head, seed=sum(map(ord, tid)))  # type: ignore[arg-type]
        for tid, (schema, head) in heads.items()
    ]
    return GroupedExecutor(base, slots)  # type: ignore[arg-type]


TENANTS = {"lib": (LIB, OFT), "cal": (CAL, FM), "pt": (PT, OFT)}


def _batches(sizes: dict[str, int], seed: int = 0) -> dict[str, ObservationBatch]:
    schemas = {"lib": LIB, "cal": CAL, "pt": PT}
    return {
        t: ObservationBatch.synthetic(schemas[t], n, seed=seed + i)
        for i, (t, n) in enumerate(sizes.items())
    }


def test_train_step_is_one_forward_and_isolates_tenants(base: ResidentBaseModel) -> None:
    counting = CountingBase(base)
    ex = _executor(counting, TENANTS)
    untouched = {n: p.detach().clone() for n, p in ex.slot("pt").named_parameters()}
    results = ex.train_step(_batches({"lib": 2, "cal": 1}))
    assert counting.encoded_rows == [3]  # ONE backbone forward over both tenants
    assert set(results) == {"lib", "cal"}
    assert results["lib"].policy_version == 1 and results["cal"].policy_version == 1
    assert ex.slot("pt").policy_version == 0
    assert all(torch.equal(p, untouched[n]) for n, p in ex.slot("pt").named_parameters())
    # The frozen base gets no gradient and no trainable parameter.
    assert all(not p.requires_grad and p.grad is None for p in base.model.parameters())

    counting.encoded_rows.clear()
    ex.serial_train_step(_batches({"lib": 2, "cal": 1, "pt": 2}))
    assert counting.encoded_rows == [2, 1, 2]  # one forward per tenant
    assert [ex.slot(t).policy_version for t in ("lib", "cal", "pt")] == [2, 2, 1]


def test_one_tenants_step_equals_training_it_alone(base: ResidentBaseModel) -> None:
    grouped = _executor(base, TENANTS)
    alone = _executor(base, {"cal": TENANTS["cal"]})
    batches = _batches({"lib": 3, "cal": 2, "pt": 1})
    g = grouped.train_step(batches)
    a = alone.train_step({"cal": batches["cal"]})
    assert g["cal"].loss == pytest.approx(a["cal"].loss, rel=1e-5)
    assert g["cal"].grad_norm == pytest.approx(a["cal"].grad_norm, rel=1e-4)
    # Each tenant's optimizer state belongs to its own parameters only.
    for tid in TENANTS:
        own = {id(p) for p in grouped.slot(tid).parameters()}
        assert set(map(id, grouped.slot(tid).optimizer.state)) <= own


def test_training_errors_name_the_tenant(base: ResidentBaseModel) -> None:
    ex = _executor(base, TENANTS)
    no_actions = ObservationBatch.synthetic(LIB, 1, seed=0, with_actions=False)
    with pytest.raises(InvalidRequestError, match=r"'lib'.*needs actions"):
        ex.train_step({"lib": no_actions})
    with pytest.raises(NotFoundError, match="'ghost'"):
        ex.train_step({"ghost": no_actions})
    wrong = ObservationBatch.synthetic(CAL, 1, seed=0)
    with pytest.raises(SchemaMismatchError, match="cameras"):
        ex.train_step({"lib": wrong})
    assert ex.slot("lib").policy_version == 0
    with pytest.raises(InvalidRequestError, match="another base model"):
        ex.add_slot(TenantSlot("other", LIB, copy.copy(base), OFT))
    with pytest.raises(InvalidRequestError, match="already has a slot"):
        ex.add_slot(TenantSlot("lib", LIB, base, OFT))


def test_grouped_predict_equals_serial_predict(base: ResidentBaseModel) -> None:
    ex = _executor(base, TENANTS)
    batches = _batches({"lib": 2, "cal": 3, "pt": 1}, seed=5)

    def gens() -> dict[str, torch.Generator]:
        return {t: torch.Generator().manual_seed(11) for t in batches}

    grouped = grouped_predict(ex, batches, generators=gens())
    serial = serial_predict(ex, batches, generators=gens())
    for tid, schema in (("lib", LIB), ("cal", CAL), ("pt", PT)):
        assert grouped[tid].shape == (
            batches[tid].batch_size,
            schema.action_chunk,
            schema.action_dim,
        )
        torch.testing.assert_close(grouped[tid], serial[tid], rtol=0, atol=1e-5)


def test_run_requests_answers_each_request_with_its_rows(base: ResidentBaseModel) -> None:
    ex = _executor(base, {"lib": (LIB, OFT), "pt": (PT, OFT)})
    obs = [
        ObservationBatch.synthetic(LIB, 2, seed=1, with_actions=False),
        ObservationBatch.synthetic(PT, 1, seed=2, with_actions=False),
        ObservationBatch.synthetic(LIB, 1, seed=3, with_actions=False),
    ]
    requests = [
        ServeRequest("lib", obs[0], 0),
        ServeRequest("pt", obs[1]),
        ServeRequest("lib", obs[2]),
    ]
    results = ex.run_requests(requests)
    assert [r.tenant_id for r in results] == ["lib", "pt", "lib"]
    assert [r.actions.shape for r in results] == [(2, 8, 7), (1, 8, 2), (1, 8, 7)]
    assert all(r.policy_version == 0 and r.actions.dtype == np.float32 for r in results)
    for req, res in zip(requests, results, strict=True):
        alone = grouped_predict(ex, {req.tenant_id: req.observation})[req.tenant_id]
        np.testing.assert_allclose(res.actions, alone.numpy(), atol=1e-5, rtol=0)

    with pytest.raises(ConflictError, match="pins policy version 3"):
        ex.run_requests([ServeRequest("lib", obs[0], 3)])
    with pytest.raises(NotFoundError):
        ex.run_requests([ServeRequest("nobody", obs[0])])
    with pytest.raises(SchemaMismatchError):
        ex.run_requests([ServeRequest("pt", obs[0])])


def test_sample_mode_returns_log_probs_and_values(base: ResidentBaseModel) -> None:
    slot = TenantSlot("rl", LIB, base, OFT, value_head=ValueHeadConfig(hidden_dim=16))
    ex = GroupedExecutor(base, [slot])
    obs = ObservationBatch.synthetic(LIB, 3, seed=4, with_actions=False)
    (res,) = ex.run_requests([ServeRequest("rl", obs)], "sample")
    assert res.log_probs is not None and res.log_probs.shape == (3,)
    assert res.values is not None and res.values.shape == (3,)
    mean = grouped_predict(ex, {"rl": obs})["rl"].numpy()
    assert not np.allclose(res.actions, mean)  # sampled, not the mean
    features = ex.shared_forward({"rl": obs})["rl"]
    lp = slot.action_module.log_prob(  # type: ignore[operator]
        features, torch.from_numpy(obs.state), torch.from_numpy(res.actions)
    )
    np.testing.assert_allclose(res.log_probs, lp.detach().numpy(), rtol=1e-4)


def test_memory_for_n_tenants_is_base_plus_slots(base: ResidentBaseModel) -> None:
    ex = _executor(base, {f"t{i}": (LIB if i % 2 else CAL, OFT if i % 2 else FM) for i in range(6)})
    slot_sum = sum(s.parameter_bytes() for s in ex.slots.values())
    assert slot_sum > 0
    total = resident_bytes(base.model.parameters(), ex.slots.values())
    assert total == base.parameter_bytes() + slot_sum
    assert all(s.base is base for s in ex.slots.values())


def test_a_predict_holds_the_lock_for_the_forward_and_heads_only(
    base: ResidentBaseModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Canonicalization runs before the backbone lock and the answers' copy to host
    memory after it: a training step waiting for the lock waits for neither."""
    lock = PriorityRLock()
    seen: dict[str, list[bool]] = {"canonicalize": [], "encode": [], "to_host": []}
    counting = CountingBase(base)
    inner_canon, inner_encode = counting.canonicalize, counting.encode

    def canonicalize(groups: list, *, validated: bool = False) -> VLAFeature:  # type: ignore[type-arg]
        seen["canonicalize"].append(lock.held_by_me())
        return inner_canon(groups, validated=validated)

    def encode(feature: VLAFeature) -> BackboneOutput:
        seen["encode"].append(lock.held_by_me())
        return inner_encode(feature)

    real_numpy = grouped_module._numpy

    def to_host(tensor: torch.Tensor | None) -> np.ndarray | None:
        seen["to_host"].append(lock.held_by_me())
        return real_numpy(tensor)

    monkeypatch.setattr(counting, "canonicalize", canonicalize)
    monkeypatch.setattr(counting, "encode", encode)
    monkeypatch.setattr(grouped_module, "_numpy", to_host)
    slots = [TenantSlot(t, s, counting, OFT, seed=1) for t, s in (("lib", LIB), ("pt", PT))]  # type: ignore[arg-type]
    ex = GroupedExecutor(counting, slots, lock=lock)  # type: ignore[arg-type]
    obs = [
        ObservationBatch.synthetic(LIB, 2, seed=1, with_actions=False),
        ObservationBatch.synthetic(PT, 1, seed=2, with_actions=False),
    ]
    results = ex.run_requests([ServeRequest("lib", obs[0]), ServeRequest("pt", obs[1])])
    assert [r.actions.shape[0] for r in results] == [2, 1]
    assert seen["canonicalize"] == [False]
    assert seen["encode"] == [True]
    assert seen["to_host"] and not any(seen["to_host"])


def test_a_small_serving_batch_runs_its_forward_in_one_thread(
    base: ResidentBaseModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By the size rule: below SERIAL_FORWARD_MACS the batch's forward and heads run in
    the calling thread alone; above it, with torch's intra-op threads (the answers are
    the same)."""
    from joynexus.models import backbone as backbone_module
    from joynexus.utils.intra_op import thread_intra_op_threads

    base.use_forward_split("size")  # as the suite pins it (tests/conftest.py)
    counting = CountingBase(base)
    threads: list[int] = []
    inner = counting.encode

    def encode(feature: VLAFeature) -> BackboneOutput:
        threads.append(thread_intra_op_threads())
        return inner(feature)

    monkeypatch.setattr(counting, "encode", encode)
    ex = _executor(counting, {"lib": (LIB, OFT), "pt": (PT, OFT)})
    obs = ObservationBatch.synthetic(LIB, 2, seed=1, with_actions=False)
    feature = base.canonicalize([("lib", LIB, obs)])
    assert not base.forward_splits(feature)  # the tiny model: a few thousand MACs per op
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (small,) = ex.run_requests([ServeRequest("lib", obs)])
        monkeypatch.setattr(backbone_module, "SERIAL_FORWARD_MACS", 1)
        assert base.forward_splits(feature)
        (split,) = ex.run_requests([ServeRequest("lib", obs)])
    finally:
        torch.set_num_threads(before)
        base.use_forward_split("size")
    assert threads == [1, 2]
    np.testing.assert_allclose(small.actions, split.actions, rtol=1e-5, atol=1e-6)


def test_a_serving_batch_runs_the_way_its_backbone_measured_cheaper(
    base: ResidentBaseModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``measured`` (the default): the executor tells the backbone what each forward
    cost, run split or serial, and once serial has cost less the batches run serial
    although the size rule says split (a busy second core)."""
    from joynexus.models import backbone as backbone_module
    from joynexus.utils.intra_op import thread_intra_op_threads

    monkeypatch.setattr(backbone_module, "SERIAL_FORWARD_MACS", 1)  # the rule: split
    base.use_forward_split("measured")  # a fresh chooser
    counting = CountingBase(base)
    took: list[bool] = []
    threads: list[int] = []
    inner_took, inner_encode = counting.forward_took, counting.encode

    def forward_took(feature: VLAFeature, split: bool, seconds: float) -> None:
        took.append(split)
        inner_took(feature, split, 10.0 if split else 1.0)  # split costs 10× here

    def encode(feature: VLAFeature) -> BackboneOutput:
        threads.append(thread_intra_op_threads())
        return inner_encode(feature)

    monkeypatch.setattr(counting, "forward_took", forward_took)
    monkeypatch.setattr(counting, "encode", encode)
    ex = _executor(counting, {"lib": (LIB, OFT)})
    obs = ObservationBatch.synthetic(LIB, 2, seed=1, with_actions=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        answers = [ex.run_requests([ServeRequest("lib", obs)])[0] for _ in range(4)]
    finally:
        torch.set_num_threads(before)
        base.use_forward_split("size")  # as the suite pins it
    assert took == [True, False, False, False]
    assert threads == [2, 1, 1, 1]
    np.testing.assert_allclose(answers[0].actions, answers[3].actions, rtol=1e-5, atol=1e-6)


def test_the_decode_plan_is_metered_with_the_heads_not_the_canonicalization(
    base: ResidentBaseModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan that slices each decode group's rows and state (before the lock) is
    head work: its time goes to ``head``, canonicalization's to ``canonicalize``."""
    now = [0.0]
    monkeypatch.setattr(grouped_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    counting = CountingBase(base)
    inner_canon = counting.canonicalize

    def canonicalize(groups: list, *, validated: bool = False) -> VLAFeature:  # type: ignore[type-arg]
        now[0] += 10.0  # a fake clock: canonicalization takes 10 s
        return inner_canon(groups, validated=validated)

    real_to_tensor = grouped_module._to_tensor

    def planned(value: np.ndarray, device: torch.device) -> torch.Tensor:
        now[0] += 1.0  # each decode group's state takes 1 s
        return real_to_tensor(value, device)

    monkeypatch.setattr(counting, "canonicalize", canonicalize)
    monkeypatch.setattr(grouped_module, "_to_tensor", planned)
    ex = _executor(counting, {"lib": (LIB, OFT), "pt": (PT, OFT)})
    obs = [
        ObservationBatch.synthetic(LIB, 1, seed=1, with_actions=False),
        ObservationBatch.synthetic(PT, 1, seed=2, with_actions=False),
    ]
    times = StageTimes()
    ex.run_requests([ServeRequest("lib", obs[0]), ServeRequest("pt", obs[1])], times=times)
    assert times.canonicalize_s == 10.0
    assert times.head_s == 2.0  # two decode groups, one per tenant
