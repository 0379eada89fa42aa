"""A LeRobot π0 checkpoint (``type: pi0``) as the resident prefix, ``pi0_expert``
tenants on it (the same action-module type as transformers' π0: the resident decides
which expert a tenant gets).

The checkpoint is a tiny random one written by lerobot 0.6.1 itself in the reference
environment (required: these tests FAIL, never skip, without it; how it is shrunk:
tests/interop/lerobot_pi_helpers.py). Parity with lerobot's ``select_action`` is
tests/interop/test_lerobot_pi0.py; the shapes and batches are π0.5's
(tests/models/policies/test_pi05_expert.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from joynexus.errors import SpecError
from joynexus.interop.lerobot import POSTPROCESSOR, SchemaDims, check_lerobot_base
from joynexus.models.archs.lerobot_pi import PI0_ARCH
from joynexus.models.archs.lerobot_pi.checkpoint import (
    Pi0LeRobotCheckpoint,
    lerobot_names,
    pi0_prompt,
)
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.pi0_export import export_pi0_checkpoint
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.lora import LoRAConfig
from joynexus.models.policies.pi0_expert import LeRobotPi0Expert, Pi0ExpertConfig
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot
from joynexus.workflows.compile import compile_workloads
from tests.interop.lerobot_pi_helpers import tiny_pi0
from tests.models.policies.test_pi05_expert import (
    FITS,
    REL,
    SCHEMAS,
    _batches,
    _copy,
    _rel,
    _spec,
    check_an_rl_step,
    schema,
)
from tests.models.reference import grouped_predict, load_slot, save_slot, serial_predict
from tests.models.test_lora_vision import randomize


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_pi0(tmp_path_factory.mktemp("lerobot") / "pi0")


@pytest.fixture(scope="module")
def base(checkpoint: Path) -> ResidentBaseModel:
    return ResidentBaseModel.from_pretrained(str(checkpoint))


def _pi0(base: ResidentBaseModel) -> Pi0LeRobotCheckpoint:
    found = base.extension(Pi0LeRobotCheckpoint)
    assert found is not None
    return found


def _executor(base: ResidentBaseModel, lora: LoRAConfig | None = None) -> GroupedExecutor:
    slots = [
        TenantSlot(
            t, s, base, Pi0ExpertConfig(lora=lora), seed=i, optimizer=OptimizerConfig(lr=1e-3)
        )
        for i, (t, s) in enumerate(SCHEMAS.items())
    ]
    return GroupedExecutor(base, slots)


def test_the_prompt_is_the_instruction_and_names_are_pi0s() -> None:
    assert pi0_prompt("pick up the cube") == "pick up the cube\n"
    assert pi0_prompt("open\n") == "open\n"
    one = torch.ones(1)
    names = lerobot_names({"time_mlp_in.weight": one, "model.state_proj.bias": one}, "pi0")
    assert set(names) == {"action_time_mlp_in.weight", "state_proj.bias"}


def test_the_prefix_is_resident_once_and_each_tenant_copies_the_expert(
    base: ResidentBaseModel,
) -> None:
    assert base.arch == PI0_ARCH and base.num_camera_slots == 2
    slot = TenantSlot("a", SCHEMAS["a"], base, Pi0ExpertConfig())
    expert = slot.action_module
    assert isinstance(expert, LeRobotPi0Expert)
    template = _pi0(base).expert_state
    state = expert.expert_state()
    assert set(state) == set(template)
    assert all(torch.equal(state[k], template[k]) for k in state)
    # π0's state token and time MLP, plain (not adaptive) norms.
    assert {"state_proj.weight", "action_time_mlp_in.weight"} <= set(state)
    assert not any(".dense." in k for k in state)
    assert not any(p.requires_grad for p in base.model.parameters())


def test_grouped_equals_serial_actions_and_losses(base: ResidentBaseModel) -> None:
    batches = _batches()

    def gens() -> dict[str, torch.Generator]:
        return {t: torch.Generator().manual_seed(7) for t in batches}

    ex = _executor(base)
    pg = grouped_predict(ex, batches, generators=gens())
    ps = serial_predict(ex, batches, generators=gens())
    for t, s in SCHEMAS.items():
        assert pg[t].shape == (2, s.action_chunk, s.action_dim)
        assert _rel(pg[t], ps[t]) <= REL
    grouped_steps = _executor(base).train_step(batches)
    serial_steps = _executor(base).serial_train_step(batches)
    for t in batches:
        g, s = grouped_steps[t].loss, serial_steps[t].loss
        assert abs(g - s) <= REL * abs(s)


def test_lora_on_the_pi0_prefix_grouped_equals_serial(base: ResidentBaseModel) -> None:
    lora = LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    ex = _executor(base, lora)
    randomize(ex.slots["a"], 10, only="language_model")
    batches = _batches()
    grouped = ex.shared_forward(batches)
    for t, batch in batches.items():
        serial = ex.shared_forward({t: batch})[t]
        assert _rel(grouped[t].hidden_states, serial.hidden_states) <= REL, t


def test_a_train_step_moves_only_the_tenants_expert(base: ResidentBaseModel) -> None:
    prefix = {k: v.clone() for k, v in base.model.state_dict().items()}
    ex = _executor(base)
    other = ex.slots["b"]
    before = {k: v.clone() for k, v in other.action_module.state_dict().items()}
    template = _pi0(base).expert_state
    ex.train_step({"a": ObservationBatch.synthetic(SCHEMAS["a"], 4, seed=3)})
    assert all(torch.equal(v, base.model.state_dict()[k]) for k, v in prefix.items())
    assert all(torch.equal(v, other.action_module.state_dict()[k]) for k, v in before.items())
    mine = ex.slots["a"].action_module.state_dict()
    moved = {k for k, v in mine.items() if not torch.equal(v, template[k])}
    assert {"state_proj.weight", "action_time_mlp_in.weight", "action_out_proj.weight"} <= moved
    assert any(k.startswith("gemma_expert.layers.") for k in moved)


def test_an_rl_step_moves_the_flow_sde_log_probability(base: ResidentBaseModel) -> None:
    check_an_rl_step(base, Pi0ExpertConfig())


def test_bad_pi0_checkpoints_are_spec_errors_at_spec_check_and_submission(
    checkpoint: Path, base: ResidentBaseModel, tmp_path: Path
) -> None:
    assert check_lerobot_base(str(checkpoint), FITS) is not None
    run = compile_workloads([_spec(checkpoint, 6, "pi0_expert")], allow_custom=True)
    assert [w.tenant_id for w in run.workloads] == ["alice"]
    unknown = _copy(checkpoint, tmp_path / "unknown")
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "type": "pi07"}))
    with pytest.raises(SpecError, match="type 'pi07' is an unknown type"):
        check_lerobot_base(str(unknown), FITS)
    with pytest.raises(SpecError, match="unknown type"):
        compile_workloads([_spec(unknown, 6, "pi0_expert")], allow_custom=True)
    missing = _copy(checkpoint, tmp_path / "missing")
    (missing / POSTPROCESSOR).unlink()
    with pytest.raises(SpecError, match=f"{POSTPROCESSOR} is missing"):
        check_lerobot_base(str(missing), FITS)
    with pytest.raises(SpecError, match=f"{POSTPROCESSOR} is missing"):
        compile_workloads([_spec(missing, 6, "pi0_expert")], allow_custom=True)
    with pytest.raises(SpecError, match=f"{POSTPROCESSOR} is missing"):
        ResidentBaseModel.from_pretrained(str(missing))
    with pytest.raises(SpecError, match="max_action_dim of 8"):
        check_lerobot_base(str(checkpoint), SchemaDims(state_dim=6, action_dim=9, action_chunk=4))
    with pytest.raises(SpecError, match=r"schema\.action_dim"):
        compile_workloads([_spec(checkpoint, 9, "pi0_expert")], allow_custom=True)
    with pytest.raises(SpecError, match="max_action_dim of 8") as info:
        Pi0ExpertConfig().check_base(base, schema("w", 6, 9, 4, ("top",)))
    assert info.value.details["fields"] == ["schema.action_dim"]


def test_a_trained_tenant_checkpoint_restores_its_expert(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    opt = OptimizerConfig(lr=1e-3)
    slot = TenantSlot("a", SCHEMAS["a"], base, Pi0ExpertConfig(), optimizer=opt)
    batch = ObservationBatch.synthetic(SCHEMAS["a"], 2, seed=5)
    GroupedExecutor(base, [slot]).train_step({"a": batch})
    saved = save_slot(slot, tmp_path, 1)
    fresh = TenantSlot("a", SCHEMAS["a"], base, Pi0ExpertConfig(), optimizer=opt)
    load_slot(fresh, saved)
    trained, restored = slot.action_module.state_dict(), fresh.action_module.state_dict()
    assert all(torch.equal(v, restored[k]) for k, v in trained.items())
    assert any(not torch.equal(v, _pi0(base).expert_state[k]) for k, v in trained.items())
    # transformers' π0 format is not this tenant's: the error names the one that is.
    with pytest.raises(SpecError, match="--format lerobot"):
        export_pi0_checkpoint(saved, tmp_path / "pi0", base=base)
