"""Payloads (export_params / load_weights) and atomic, verified slot checkpoints."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from joynexus.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    SchemaMismatchError,
)
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.checkpoints import payload as payload_mod
from joynexus.models.checkpoints.payload import (
    TenantPayload,
    checkpoint_dir,
    export_params,
    load_weights,
    read_manifest,
)
from joynexus.models.policies import FlowMatchingHeadConfig, OFTHeadConfig, ValueHeadConfig
from joynexus.models.schema import CALVIN, LIBERO
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot
from joynexus.models.types import BackboneOutput
from tests.models.conftest import TinyBackbone
from tests.models.reference import load_slot, save_slot, train_step

OFT = OFTHeadConfig(hidden_dim=32, num_blocks=1)
FM = FlowMatchingHeadConfig(hidden_dim=32, num_layers=1, num_heads=2)


@pytest.fixture
def base(tiny_backbone: TinyBackbone) -> ResidentBaseModel:
    return tiny_backbone("qwen2_5_vl")


def _data(base: ResidentBaseModel, step: int) -> tuple[BackboneOutput, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    f = BackboneOutput(
        hidden_states=torch.randn(2, 5, base.hidden_size, generator=g),
        attention_mask=torch.ones(2, 5, dtype=torch.long),
    )
    return f, torch.randn(2, 8, generator=g), torch.randn(2, 8, 7, generator=g)


def _train(slot: TenantSlot, steps: range) -> list[float]:
    return [train_step(slot, *_data(slot.base, i)).loss for i in steps]  # type: ignore[arg-type]


def _slot(base: ResidentBaseModel, tenant: str = "t1", seed: int = 0, **kw: object) -> TenantSlot:
    return TenantSlot(tenant, LIBERO, base, OFT, seed=seed, **kw)  # type: ignore[arg-type]


def test_export_holds_only_this_tenants_tensors(base: ResidentBaseModel) -> None:
    slot = _slot(base, value_head=ValueHeadConfig(hidden_dim=16))
    _train(slot, range(2))
    payload = export_params(slot)
    assert payload.tenant_id == "t1" and payload.policy_version == 2
    assert payload.schema_signature == slot.schema_signature
    assert all(n.startswith(("action_module.", "value_head.")) for n in payload.named_tensors)
    assert payload.nbytes() == slot.parameter_bytes()
    base_ptrs = {p.untyped_storage().data_ptr() for p in base.model.parameters()}
    base_shapes = {tuple(p.shape) for p in base.model.parameters()}
    assert all(
        t.untyped_storage().data_ptr() not in base_ptrs for t in payload.named_tensors.values()
    )
    assert payload.nbytes() < base.parameter_bytes()
    assert base_shapes  # the base is non-trivial, yet none of it is exported
    # A snapshot: later training does not change the payload.
    frozen = {n: t.clone() for n, t in payload.named_tensors.items()}
    _train(slot, range(2, 3))
    assert all(torch.equal(frozen[n], t) for n, t in payload.named_tensors.items())


def test_load_weights_reproduces_the_policy(base: ResidentBaseModel) -> None:
    trainer = TenantSlot("t1", LIBERO, base, FM, seed=0)
    server = TenantSlot("t1", LIBERO, base, FM, seed=99)
    _train(trainer, range(3))
    f, state, _ = _data(base, 50)
    gen = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    assert not torch.equal(
        trainer.predict(f, state, generator=gen()), server.predict(f, state, generator=gen())
    )
    load_weights(server, export_params(trainer))
    assert server.policy_version == 3
    assert torch.equal(
        trainer.predict(f, state, generator=gen()), server.predict(f, state, generator=gen())
    )


def _mutated(p: TenantPayload, **kw: object) -> TenantPayload:
    fields = {
        "tenant_id": p.tenant_id,
        "policy_version": p.policy_version,
        "schema_signature": p.schema_signature,
        "named_tensors": dict(p.named_tensors),
    }
    fields.update(kw)
    return TenantPayload(**fields)  # type: ignore[arg-type]


def test_load_weights_validation_names_the_problem(base: ResidentBaseModel) -> None:
    slot = _slot(base)
    good = export_params(_slot(base, seed=5))
    before = {n: t.clone() for n, t in export_params(slot).named_tensors.items()}
    name = "action_module.out_proj.weight"

    with pytest.raises(SchemaMismatchError, match="schema signature"):
        load_weights(slot, _mutated(good, schema_signature=base.signature_for(CALVIN)))
    with pytest.raises(InvalidRequestError, match="belongs to tenant"):
        load_weights(slot, _mutated(good, tenant_id="other"))
    missing = dict(good.named_tensors)
    del missing[name]
    with pytest.raises(InvalidRequestError, match=r"missing \['action_module.out_proj.weight'\]"):
        load_weights(slot, _mutated(good, named_tensors=missing))
    extra = dict(good.named_tensors) | {"base.lm.weight": torch.zeros(2)}
    with pytest.raises(InvalidRequestError, match="unexpected"):
        load_weights(slot, _mutated(good, named_tensors=extra))
    shape = dict(good.named_tensors) | {name: torch.zeros(3, 3)}
    expected = list(good.named_tensors[name].shape)
    with pytest.raises(
        InvalidRequestError, match=re.escape(f"{name}: expected shape {expected}")
    ) as exc:
        load_weights(slot, _mutated(good, named_tensors=shape))
    assert exc.value.details["expected_shape"] == expected
    dtype = dict(good.named_tensors) | {name: good.named_tensors[name].double()}
    with pytest.raises(InvalidRequestError, match="dtype"):
        load_weights(slot, _mutated(good, named_tensors=dtype))
    # Every rejection left the slot as it was.
    after = export_params(slot)
    assert after.policy_version == 0
    assert all(torch.equal(before[n], t) for n, t in after.named_tensors.items())


def test_checkpoint_roundtrip_resumes_exactly(base: ResidentBaseModel, tmp_path: Path) -> None:
    cfg = OptimizerConfig(lr=3e-3, weight_decay=0.05)
    a = _slot(base, optimizer=cfg, value_head=ValueHeadConfig(hidden_dim=16))
    _train(a, range(3))
    path = save_slot(a, tmp_path, step=3, base_model_hash="abc123", clock=lambda: 1234.5)
    assert path == tmp_path / "t1" / "step_3"
    assert sorted(p.name for p in path.iterdir()) == [
        "action_module.safetensors",
        "manifest.json",
        "optimizer.json",
        "optimizer.safetensors",
    ]
    assert [p.name for p in (tmp_path / "t1").iterdir()] == ["step_3"]  # no temp dirs left
    manifest = read_manifest(path)
    assert manifest.tenant_id == "t1" and manifest.step == 3 and manifest.policy_version == 3
    assert manifest.base_model_id == base.model_id and manifest.base_model_hash == "abc123"
    assert manifest.schema_signature == a.schema_signature and manifest.created == 1234.5
    assert set(manifest.files) == {
        "action_module.safetensors",
        "optimizer.safetensors",
        "optimizer.json",
    }

    b = _slot(base, seed=42, optimizer=cfg, value_head=ValueHeadConfig(hidden_dim=16))
    load_slot(b, path, base_model_hash="abc123")
    assert b.policy_version == 3
    # Resumed training equals uninterrupted training, step for step (optimizer moments
    # restored; the flow-free OFT loss has no RNG to restore).
    assert _train(b, range(3, 6)) == _train(a, range(3, 6))


def test_checkpoint_without_optimizer_and_integrity(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    a = _slot(base)
    _train(a, range(1))
    path = save_slot(a, tmp_path, step=1, include_optim=False)
    assert not (path / "optimizer.safetensors").exists()
    with pytest.raises(ConflictError, match="already exists"):
        save_slot(a, tmp_path, step=1)
    with pytest.raises(InvalidRequestError, match="belongs to tenant"):
        load_slot(_slot(base, tenant="t2"), path)
    with pytest.raises(SchemaMismatchError, match="schema signature"):
        load_slot(TenantSlot("t1", CALVIN, base, OFT), path)
    with pytest.raises(SchemaMismatchError, match="base model"):
        save_slot(a, tmp_path, step=2, base_model_hash="h1")
        load_slot(_slot(base), tmp_path / "t1" / "step_2", base_model_hash="h2")
    with pytest.raises(NotFoundError):
        load_slot(a, tmp_path / "t1" / "step_99")
    blob = path / "action_module.safetensors"
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    fresh = _slot(base, seed=7)
    with pytest.raises(InvalidRequestError, match="sha256"):
        load_slot(fresh, path)
    assert fresh.policy_version == 0


def test_failed_save_leaves_nothing_behind(
    base: ResidentBaseModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _slot(base)
    real = payload_mod.save_file

    def failing(tensors: dict[str, torch.Tensor], filename: str) -> None:
        if filename.endswith("optimizer.safetensors"):
            raise OSError("disk full")
        real(tensors, filename)

    monkeypatch.setattr(payload_mod, "save_file", failing)
    with pytest.raises(OSError, match="disk full"):
        save_slot(a, tmp_path, step=0)
    assert list((tmp_path / "t1").iterdir()) == []


def test_checkpoint_paths_reject_traversal(tmp_path: Path) -> None:
    for bad in ("../evil", "a/b", "..", "/abs"):
        with pytest.raises(InvalidRequestError):
            checkpoint_dir(tmp_path, bad, 1)
    with pytest.raises(InvalidRequestError, match="step"):
        checkpoint_dir(tmp_path, "ok", -1)


def test_optimizer_json_uses_parameter_names(base: ResidentBaseModel, tmp_path: Path) -> None:
    a = _slot(base)
    _train(a, range(1))
    meta = json.loads((save_slot(a, tmp_path, step=1) / "optimizer.json").read_text())
    names = meta["param_groups"][0]["param_names"]
    assert names == [n for n, _ in a.named_parameters()]
    assert meta["param_groups"][0]["lr"] == a.optimizer_config.lr
