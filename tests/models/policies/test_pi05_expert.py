"""A LeRobot π0.5 checkpoint as the resident prefix, tenant-private experts on it.

The checkpoint is a tiny random one written by lerobot 0.6.1 itself in the reference
environment (required: these tests FAIL, never skip, without it; how it is shrunk:
tests/interop/lerobot_pi_helpers.py). Parity with lerobot's ``select_action`` is
tests/interop/test_lerobot_pi05.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from joynexus.algorithms.losses import ppo_loss
from joynexus.errors import SpecError
from joynexus.interop.lerobot import POSTPROCESSOR, SchemaDims, check_lerobot_base
from joynexus.models.archs.lerobot_pi import PI05_ARCH
from joynexus.models.archs.lerobot_pi.checkpoint import (
    Pi05Checkpoint,
    lerobot_names,
    pi05_prompt,
)
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.policies.base import PolicyConfig
from joynexus.models.policies.pi05_expert import Pi05Expert, Pi05ExpertConfig
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot
from joynexus.spec.workload import WorkloadSpec, parse_spec
from joynexus.workflows.compile import compile_workloads
from tests.interop.lerobot_pi_helpers import tiny_pi05
from tests.models.reference import apply_loss, grouped_predict, load_slot, save_slot, serial_predict

REL = 1e-5


def schema(name: str, state: int, action: int, chunk: int, cameras: tuple[str, ...]) -> DataSchema:
    return DataSchema(
        name=name,
        cameras={c: CameraSpec(height=32, width=32) for c in cameras},
        state_dim=state,
        action_dim=action,
        action_chunk=chunk,
        fps=10.0,
        instruction="pick up the block",
    )


#: Two tenants of different shapes within the checkpoint's limits (state and action 8,
#: chunk 4); the second shows one camera fewer and a shorter state (a shorter prompt).
SCHEMAS = {
    "a": schema("a", 6, 6, 4, ("top", "wrist")),
    "b": schema("b", 3, 2, 3, ("top",)),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_pi05(tmp_path_factory.mktemp("lerobot") / "pi05")


@pytest.fixture(scope="module")
def base(checkpoint: Path) -> ResidentBaseModel:
    return ResidentBaseModel.from_pretrained(str(checkpoint))


def _pi05(base: ResidentBaseModel) -> Pi05Checkpoint:
    found = base.extension(Pi05Checkpoint)
    assert found is not None
    return found


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _batches(n: int = 2) -> dict[str, ObservationBatch]:
    out = {t: ObservationBatch.synthetic(s, n, seed=i) for i, (t, s) in enumerate(SCHEMAS.items())}
    out["a"] = dataclasses.replace(out["a"], instructions=["open", "put the bowl on the plate"])
    return out


def _executor(base: ResidentBaseModel) -> GroupedExecutor:
    slots = [
        TenantSlot(t, s, base, Pi05ExpertConfig(), seed=i, optimizer=OptimizerConfig(lr=1e-3))
        for i, (t, s) in enumerate(SCHEMAS.items())
    ]
    return GroupedExecutor(base, slots)


def test_the_prompt_carries_the_discretized_state() -> None:
    import numpy as np

    prompt = pi05_prompt(" pick_up\nthe cube ", np.array([-1.5, -1.0, 0.0, 0.999, 1.5]))
    assert prompt == "Task: pick up the cube, State: -1 0 128 255 255;\nAction: "


def test_hub_checkpoint_names_are_read_as_lerobot_reads_them() -> None:
    one = torch.ones(1)
    names = lerobot_names(
        {
            "action_time_mlp_in.weight": one,
            "model.action_out_proj.bias": one,
            "state_proj.weight": one,
            "paligemma_with_expert.paligemma.lm_head.weight": one,
        }
    )
    assert set(names) == {
        "time_mlp_in.weight",
        "action_out_proj.bias",
        "paligemma_with_expert.paligemma.lm_head.weight",
        "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight",
    }


def test_the_prefix_is_resident_once_and_each_tenant_copies_the_expert(
    base: ResidentBaseModel,
) -> None:
    assert base.arch == PI05_ARCH and base.num_camera_slots == 2
    slot = TenantSlot("a", SCHEMAS["a"], base, Pi05ExpertConfig())
    expert = slot.action_module
    assert isinstance(expert, Pi05Expert)
    template = _pi05(base).expert_state
    state = expert.expert_state()
    assert set(state) == set(template)
    assert all(torch.equal(state[k], template[k]) for k in state)
    # π0.5's adaptive norms: the time conditioning's modulation is the tenant's.
    assert any(k.endswith("input_layernorm.dense.weight") for k in state)
    assert not any(p.requires_grad for p in base.model.parameters())
    assert sum(p.numel() for p in expert.parameters()) < sum(
        p.numel() for p in base.model.parameters()
    )


def test_grouped_equals_serial_actions_and_losses(base: ResidentBaseModel) -> None:
    ex = _executor(base)
    batches = _batches()

    def gens() -> dict[str, torch.Generator]:
        return {t: torch.Generator().manual_seed(7) for t in batches}

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


def test_the_state_reaches_the_prefix(base: ResidentBaseModel) -> None:
    """Two rows alike but for the state act differently through the prefix alone (the
    π0.5 expert reads no state)."""
    slot = TenantSlot("a", SCHEMAS["a"], base, Pi05ExpertConfig())
    one = ObservationBatch.synthetic(SCHEMAS["a"], 1, seed=2)
    two = ObservationBatch.concat([one, dataclasses.replace(one, state=one.state * 0 + 0.5)])
    features = GroupedExecutor(base, [slot]).shared_forward({"a": two})["a"]
    noise = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(0)).repeat(2, 1, 1)
    chunk = slot.action_module.denoise(features, torch.zeros(2, 6), noise)
    assert (chunk[0] - chunk[1]).abs().max() > 1e-4


def test_a_train_step_moves_only_the_tenants_expert(base: ResidentBaseModel) -> None:
    prefix = {k: v.clone() for k, v in base.model.state_dict().items()}
    ex = _executor(base)
    other = ex.slots["b"]
    before = {k: v.clone() for k, v in other.action_module.state_dict().items()}
    template = _pi05(base).expert_state
    ex.train_step({"a": ObservationBatch.synthetic(SCHEMAS["a"], 4, seed=3)})
    assert all(torch.equal(v, base.model.state_dict()[k]) for k, v in prefix.items())
    assert all(torch.equal(v, other.action_module.state_dict()[k]) for k, v in before.items())
    mine = ex.slots["a"]
    moved = {
        k for k, v in mine.action_module.state_dict().items() if not torch.equal(v, template[k])
    }
    assert any(k.startswith("gemma_expert.layers.") and ".dense." in k for k in moved)
    assert {"action_out_proj.weight", "time_mlp_in.weight"} <= moved


def check_an_rl_step(base: ResidentBaseModel, head: PolicyConfig) -> None:
    """A PPO step on Flow-SDE chains sampled by a ``head`` tenant raises the
    log-probability of the positively rewarded chains against the negative ones."""
    slot = TenantSlot("b", SCHEMAS["b"], base, head, optimizer=OptimizerConfig(lr=1e-3))
    expert = slot.action_module
    batch = ObservationBatch.synthetic(SCHEMAS["b"], 4, seed=1)
    features = GroupedExecutor(base, [slot]).shared_forward({"b": batch})["b"]
    state = torch.from_numpy(batch.state)
    sample = expert.sample(features, state, generator=torch.Generator().manual_seed(0))
    assert sample.actions.shape == (4, 3, 2)
    assert sample.chain is not None and sample.log_probs is not None
    old = sample.log_probs
    new = expert.log_prob(features, state, sample.chain)
    assert torch.allclose(new, old, atol=1e-4)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss, _ = ppo_loss(new, old, advantages)
    apply_loss(slot, loss)
    moved = expert.log_prob(features, state, sample.chain).detach() - old
    assert float(moved[advantages > 0].mean()) > float(moved[advantages < 0].mean())


def test_an_rl_step_moves_the_flow_sde_log_probability(base: ResidentBaseModel) -> None:
    check_an_rl_step(base, Pi05ExpertConfig())


def _copy(checkpoint: Path, to: Path) -> Path:
    """The checkpoint's small files copied, its weights linked (no 160 MB copy)."""
    to.mkdir(parents=True)
    for item in checkpoint.iterdir():
        if item.name == "model.safetensors":
            os.symlink(item, to / item.name)
        elif item.is_dir():
            shutil.copytree(item, to / item.name)
        else:
            shutil.copy2(item, to / item.name)
    return to


FITS = SchemaDims(state_dim=6, action_dim=6, action_chunk=4)


def test_bad_pi05_checkpoints_are_spec_errors_at_spec_check(
    checkpoint: Path, base: ResidentBaseModel, tmp_path: Path
) -> None:
    # A fitting π0.5 directory passes the spec-time check and loads as the π0.5 prefix.
    assert check_lerobot_base(str(checkpoint), FITS) is not None
    unknown = _copy(checkpoint, tmp_path / "unknown")
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "type": "pi07"}))
    with pytest.raises(SpecError, match="type 'pi07' is an unknown type"):
        check_lerobot_base(str(unknown), FITS)
    missing = _copy(checkpoint, tmp_path / "missing")
    (missing / POSTPROCESSOR).unlink()
    with pytest.raises(SpecError, match=f"{POSTPROCESSOR} is missing"):
        check_lerobot_base(str(missing), FITS)
    with pytest.raises(SpecError, match=f"{POSTPROCESSOR} is missing"):
        ResidentBaseModel.from_pretrained(str(missing))
    wide = SchemaDims(state_dim=6, action_dim=9, action_chunk=4)
    with pytest.raises(SpecError, match="max_action_dim of 8"):
        check_lerobot_base(str(checkpoint), wide)
    with pytest.raises(SpecError, match="max_action_dim of 8") as info:
        Pi05ExpertConfig().check_base(base, schema("w", 6, 9, 4, ("top",)))
    assert info.value.details["fields"] == ["schema.action_dim"]


def test_lora_on_the_pi05_prefix_grouped_equals_serial(base: ResidentBaseModel) -> None:
    """A tenant's LoRA on the shared prefix's language model moves its own rows only;
    grouped with a tenant without one equals each run alone."""
    from joynexus.models.lora import LoRAConfig
    from tests.models.test_lora_vision import randomize

    lora = LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    slots = [
        TenantSlot(t, s, base, Pi05ExpertConfig(lora=None if t == "b" else lora), seed=i)
        for i, (t, s) in enumerate(SCHEMAS.items())
    ]
    randomize(slots[0], 10, only="language_model")
    ex = GroupedExecutor(base, slots)
    batches = _batches()
    grouped = ex.shared_forward(batches)
    bare = ex.shared_forward(batches, adapters=dict.fromkeys(batches))
    for t, batch in batches.items():
        serial = ex.shared_forward({t: batch})[t]
        g, s = grouped[t].hidden_states, serial.hidden_states
        assert _rel(g, s) <= REL, t
        changed = float((g - bare[t].hidden_states).abs().max())
        assert (changed > 1e-4) == (t == "a"), f"{t}: adapter effect {changed}"


def _spec(model: Path, action_dim: int, head: str = "pi05_expert") -> WorkloadSpec:
    return parse_spec(
        {
            "tenant": "alice",
            "task": "custom",
            "base_model": {"id": str(model)},
            "schema": {
                "cameras": {"top": {"height": 32, "width": 32}},
                "state_dim": 6,
                "action_dim": action_dim,
                "action_chunk": 4,
            },
            "action_module": {"type": head},
        }
    )


def test_spec_check_accepts_a_fitting_pi05_and_refuses_bad_ones(
    checkpoint: Path, tmp_path: Path
) -> None:
    """What ``spec check`` and submission run (compile_workloads), before any load."""
    run = compile_workloads([_spec(checkpoint, 6)], allow_custom=True)
    assert [w.tenant_id for w in run.workloads] == ["alice"]
    with pytest.raises(SpecError, match=r"schema\.action_dim"):
        compile_workloads([_spec(checkpoint, 9)], allow_custom=True)
    unknown = _copy(checkpoint, tmp_path / "unknown")
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "type": "pi07"}))
    with pytest.raises(SpecError, match="unknown type"):
        compile_workloads([_spec(unknown, 6)], allow_custom=True)
    missing = _copy(checkpoint, tmp_path / "missing")
    (missing / "policy_preprocessor.json").unlink()
    with pytest.raises(SpecError, match=r"policy_preprocessor\.json is missing"):
        compile_workloads([_spec(missing, 6)], allow_custom=True)


def test_a_trained_tenant_checkpoint_restores_its_expert(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    """Resume: a π0.5 tenant's saved checkpoint restores the trained expert (its
    adaptive norms and projections) into a fresh slot, predicting the same."""
    opt = OptimizerConfig(lr=1e-3)
    slot = TenantSlot("a", SCHEMAS["a"], base, Pi05ExpertConfig(), optimizer=opt)
    batch = ObservationBatch.synthetic(SCHEMAS["a"], 2, seed=5)
    GroupedExecutor(base, [slot]).train_step({"a": batch})
    saved = save_slot(slot, tmp_path, 1)
    fresh = TenantSlot("a", SCHEMAS["a"], base, Pi05ExpertConfig(), optimizer=opt)
    load_slot(fresh, saved)
    trained, restored = slot.action_module.state_dict(), fresh.action_module.state_dict()
    assert all(torch.equal(v, restored[k]) for k, v in trained.items())
    assert any(not torch.equal(v, _pi05(base).expert_state[k]) for k, v in trained.items())
