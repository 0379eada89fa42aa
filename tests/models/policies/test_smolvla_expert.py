"""A LeRobot SmolVLA checkpoint as the resident prefix, tenant-private experts on it.

The checkpoint is a tiny random one written by the REAL lerobot (its side venv, required).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from joynexus.algorithms.losses import ppo_loss
from joynexus.errors import InvalidRequestError, SpecError
from joynexus.models.archs.smolvlm.resident import SmolVLAResident
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.lerobot_export import export_lerobot_checkpoint
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.normalization import FeatureNormStats, NormalizationStats
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.policies.smolvla_expert import SmolVLAExpert, SmolVLAExpertConfig
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot
from tests.interop.lerobot_helpers import TASKS, lerobot_actions, tiny_smolvla
from tests.models.reference import (
    apply_loss,
    grouped_predict,
    save_slot,
    serial_forward,
    serial_predict,
)

REL = 1e-5


def _smolvla(base: ResidentBaseModel) -> SmolVLAResident:
    """The resident model's SmolVLAResident (the extension its family asks for)."""
    found = base.extension(SmolVLAResident)
    assert found is not None
    return found


def schema(name: str, state: int, action: int, chunk: int, size: tuple[int, int]) -> DataSchema:
    return DataSchema(
        name=name,
        cameras={"top": CameraSpec(height=size[0], width=size[1], channels=3)},
        state_dim=state,
        action_dim=action,
        action_chunk=chunk,
        fps=10.0,
        instruction="pick up the block",
    )


#: Three tenants of different shapes within the tiny checkpoint's limits (state 8,
#: action 8, chunk 4); the second has one camera fewer than the checkpoint.
SCHEMAS = {
    "a": schema("a", 6, 6, 4, (64, 64)),
    "b": schema("b", 2, 2, 3, (48, 64)),
    "c": schema("c", 8, 7, 4, (96, 96)),
}
SCHEMAS["a"] = SCHEMAS["a"].model_copy(
    update={"cameras": {**SCHEMAS["a"].cameras, "wrist": CameraSpec(height=32, width=32)}}
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_smolvla(tmp_path_factory.mktemp("lerobot") / "smolvla")


@pytest.fixture(scope="module")
def base(checkpoint: Path) -> ResidentBaseModel:
    return ResidentBaseModel.from_pretrained(str(checkpoint))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _batches(n: int = 2) -> dict[str, ObservationBatch]:
    out = {t: ObservationBatch.synthetic(s, n, seed=i) for i, (t, s) in enumerate(SCHEMAS.items())}
    # Instructions of different lengths: rows need different amounts of language padding.
    out["a"] = dataclasses.replace(out["a"], instructions=["open", "put the bowl on the plate"])
    return out


def _executor(base: ResidentBaseModel) -> GroupedExecutor:
    slots = [
        TenantSlot(t, s, base, SmolVLAExpertConfig(), seed=i)
        for i, (t, s) in enumerate(SCHEMAS.items())
    ]
    return GroupedExecutor(base, slots)


def test_the_checkpoint_is_resident_once_and_each_tenant_copies_its_expert(
    base: ResidentBaseModel, checkpoint: Path
) -> None:
    assert base.arch == "smolvla" and base.extension(SmolVLAResident) is not None
    assert base.canonical_image_size == 64 and base.num_camera_slots == 2
    saved = load_file(str(checkpoint / "model.safetensors"))
    slot = TenantSlot("a", SCHEMAS["a"], base, SmolVLAExpertConfig())
    expert = slot.action_module
    assert isinstance(expert, SmolVLAExpert)
    state = expert.expert_state()
    # The expert, the action/time projections and state_proj, under LeRobot's names,
    # equal to the checkpoint's; nothing of the VLM prefix.
    assert any(k.startswith("model.vlm_with_expert.lm_expert.") for k in state)
    assert {"model.state_proj.weight", "model.action_time_mlp_out.bias"} <= set(state)
    assert not any(".vlm." in k for k in state)
    assert all(torch.equal(state[k], saved[k]) for k in state)
    assert all(p.requires_grad for p in expert.parameters())
    assert not any(p.requires_grad for p in base.model.parameters())
    # The tenant's module holds no copy of the prefix.
    prefix_params = sum(p.numel() for p in base.model.parameters())
    assert sum(p.numel() for p in expert.parameters()) < prefix_params
    fresh = TenantSlot("r", SCHEMAS["a"], base, SmolVLAExpertConfig(init="random"), seed=3)
    other = fresh.action_module.state_dict()
    assert any(not torch.equal(other[k], v) for k, v in expert.state_dict().items())


def test_grouped_equals_serial_actions_and_losses(base: ResidentBaseModel) -> None:
    ex = _executor(base)
    batches = _batches()
    serial = serial_forward(ex, batches)
    assert len({int(o.attention_mask.shape[1]) for o in serial.values()}) > 1

    def gens() -> dict[str, torch.Generator]:
        return {t: torch.Generator().manual_seed(7) for t in batches}

    pg, ps = (
        grouped_predict(ex, batches, generators=gens()),
        serial_predict(ex, batches, generators=gens()),
    )
    for t, s in SCHEMAS.items():
        assert pg[t].shape == (2, s.action_chunk, s.action_dim)
        assert _rel(pg[t], ps[t]) <= REL
    grouped_steps = _executor(base).train_step(batches)
    serial_steps = _executor(base).serial_train_step(batches)
    for t in batches:
        g, s = grouped_steps[t].loss, serial_steps[t].loss
        assert abs(g - s) <= REL * abs(s)


def test_sft_lowers_the_loss_and_steps_only_the_tenants_expert(base: ResidentBaseModel) -> None:
    resident = {k: v.clone() for k, v in _smolvla(base).model.state_dict().items()}
    opt = OptimizerConfig(lr=1e-3)
    slot = TenantSlot("a", SCHEMAS["a"], base, SmolVLAExpertConfig(), optimizer=opt)
    other = TenantSlot("b", SCHEMAS["b"], base, SmolVLAExpertConfig())
    other_before = {k: v.clone() for k, v in other.action_module.state_dict().items()}
    ex = GroupedExecutor(base, [slot, other])
    batch = ObservationBatch.synthetic(SCHEMAS["a"], 4, seed=3)
    assert batch.actions is not None
    features = ex.shared_forward({"a": batch})["a"]
    state, actions = torch.from_numpy(batch.state), torch.from_numpy(batch.actions)

    def fixed_loss() -> torch.Tensor:
        return slot.action_module.loss(
            features, state, actions, generator=torch.Generator().manual_seed(0)
        )

    start = float(fixed_loss().detach())
    for _ in range(5):
        apply_loss(slot, fixed_loss())
    assert float(fixed_loss().detach()) < 0.9 * start
    ex.train_step({"a": batch})
    after = _smolvla(base).model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in resident.items())
    assert all(torch.equal(v, other_before[k]) for k, v in other.action_module.state_dict().items())
    moved = {
        k.split(".")[0]
        for k, v in slot.action_module.state_dict().items()
        if not torch.equal(v, resident[_resident_key(k)])
    }
    # state_proj learns through the frozen layers its token passes.
    assert {"lm_expert", "state_proj", "action_out_proj"} <= moved


def _resident_key(key: str) -> str:
    return ("model.vlm_with_expert." if key.startswith("lm_expert.") else "model.") + key


def test_an_rl_step_moves_the_flow_sde_log_probability(base: ResidentBaseModel) -> None:
    opt = OptimizerConfig(lr=1e-3)
    slot = TenantSlot("a", SCHEMAS["b"], base, SmolVLAExpertConfig(), optimizer=opt)
    expert = slot.action_module
    batch = ObservationBatch.synthetic(SCHEMAS["b"], 4, seed=1)
    features = GroupedExecutor(base, [slot]).shared_forward({"a": batch})["a"]
    state = torch.from_numpy(batch.state)
    sample = expert.sample(features, state, generator=torch.Generator().manual_seed(0))
    assert sample.actions.shape == (4, 3, 2)
    assert isinstance(expert, SmolVLAExpert)
    assert sample.chain is not None and sample.log_probs is not None
    old = sample.log_probs
    new = expert.log_prob(features, state, sample.chain)
    # At the behaviour weights the ratio is exactly 1.
    assert torch.allclose(new, old, atol=1e-4)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss, _ = ppo_loss(new, old, advantages)
    apply_loss(slot, loss)
    moved = expert.log_prob(features, state, sample.chain).detach() - old
    # The step raises the log-probability of the chains with positive advantage.
    assert float(moved[advantages > 0].mean()) > float(moved[advantages < 0].mean())


def test_refusals_are_spec_errors(
    base: ResidentBaseModel, checkpoint: Path, tmp_path: Path
) -> None:
    too_wide = schema("wide", 6, 9, 5, (64, 64))
    with pytest.raises(SpecError, match="max_action_dim of 8") as info:
        TenantSlot("w", too_wide, base, SmolVLAExpertConfig())
    assert info.value.details["fields"] == ["schema.action_dim", "schema.action_chunk"]
    # A fresh head on the same prefix has no such limit.
    TenantSlot("w", too_wide, base, OFTHeadConfig(hidden_dim=16, num_blocks=1))
    # A LeRobot policy of a family JoyNexus does not host is refused by name.
    act = tmp_path / "act"
    shutil.copytree(checkpoint, act, ignore=shutil.ignore_patterns("vlm"))
    config = json.loads((act / "config.json").read_text())
    (act / "config.json").write_text(json.dumps({**config, "type": "act"}))
    with pytest.raises(SpecError, match="type 'act' is a LeRobot policy type"):
        ResidentBaseModel.from_pretrained(str(act))


def _stats(dim: int, center: float, scale: float) -> FeatureNormStats:
    mean = [center + 0.1 * i for i in range(dim)]
    std = [scale + 0.2 * i for i in range(dim)]
    return FeatureNormStats(
        mean=mean, std=std, q01=[m - 2 for m in mean], q99=[m + 2 for m in mean]
    )


def _chw(pixels: torch.Tensor) -> torch.Tensor:
    """``uint8 [B, H, W, C]`` → what lerobot takes: ``float [B, C, H, W]`` in [0, 1]."""
    return (pixels.permute(0, 3, 1, 2).float() / 255).contiguous()


def test_a_trained_tenant_exports_as_a_lerobot_policy_that_lerobot_runs_identically(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    """Out: the tenant checkpoint → `export --format lerobot` → lerobot's from_pretrained
    and select_action give JoyNexus's actions for the same observation and noise."""
    both = {"top": CameraSpec(height=64, width=64), "wrist": CameraSpec(height=64, width=64)}
    own = schema("own", 6, 6, 4, (64, 64)).model_copy(update={"cameras": both})
    opt = OptimizerConfig(lr=1e-3)
    slot = TenantSlot("t", own, base, SmolVLAExpertConfig(), optimizer=opt)
    # The tenant's own statistics: they win over the checkpoint's in the export.
    slot.normalization = NormalizationStats(state=_stats(6, 0.5, 2.0), action=_stats(6, 0.1, 1.0))
    ex = GroupedExecutor(base, [slot])
    for _ in range(2):
        ex.train_step({"t": ObservationBatch.synthetic(own, 2, seed=4)})
    saved = save_slot(slot, tmp_path / "outputs", 2, include_optim=False)
    out = export_lerobot_checkpoint(saved, tmp_path / "exported", base=base)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "policy_postprocessor.json",
        "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
        "policy_preprocessor.json",
        "policy_preprocessor_step_5_normalizer_processor.safetensors",
        "vlm",  # the tiny checkpoint's own VLM (config + tokenizer) travels with it
    ]
    assert json.loads((out / "config.json").read_text())["type"] == "smolvla"

    mine, theirs = _ours_and_lerobots(base, slot, out, tmp_path)
    assert theirs.shape == mine.shape == (2, 4, 6)
    assert (mine - theirs).abs().max().item() <= 1e-4
    # Not vacuous: the checkpoint's own (untrained) expert acts otherwise.
    template = TenantSlot("u", own, base, SmolVLAExpertConfig())
    template.normalization = slot.normalization
    assert (_ours_and_lerobots(base, template, None, tmp_path)[0] - theirs).abs().max() > 1e-3


def _ours_and_lerobots(
    base: ResidentBaseModel, slot: TenantSlot, exported: Path | None, tmp_path: Path
) -> tuple[torch.Tensor, torch.Tensor]:
    """JoyNexus's actions for ``slot`` (its adapter on the prefix, if any) and, unless
    ``exported`` is None, lerobot's for the exported directory: the same observation
    (two cameras, 6-d state) and noise."""
    g = torch.Generator().manual_seed(11)
    pixels = {
        c: torch.randint(0, 256, (2, 64, 64, 3), generator=g, dtype=torch.uint8)
        for c in ("top", "wrist")
    }
    state = torch.randn(2, 6, generator=g)
    noise = torch.randn(2, 4, 8, generator=g)
    theirs = torch.empty(0)
    if exported is not None:
        obs = {f"observation.images.{c}": _chw(p) for c, p in pixels.items()}
        obs = {**obs, "observation.state": state, "noise": noise}
        theirs = lerobot_actions(exported, obs, tmp_path / "r", select=True)
    batch = ObservationBatch(
        cameras={c: p.numpy() for c, p in pixels.items()}, state=state.numpy(), instructions=TASKS
    )
    features = GroupedExecutor(base, [slot]).shared_forward({slot.tenant_id: batch})
    expert, norm = slot.action_module, slot.normalization
    assert isinstance(expert, SmolVLAExpert) and norm is not None
    model_state = torch.from_numpy(norm.normalize(state.numpy(), "state"))
    with torch.no_grad():
        chunk = expert.denoise(features[slot.tenant_id], model_state, noise)[:, :4, :6]
    return torch.from_numpy(norm.unnormalize(chunk.numpy(), "action")), theirs


def test_a_lora_tenant_exports_merged_and_lerobot_runs_it_identically(
    base: ResidentBaseModel, checkpoint: Path, tmp_path: Path
) -> None:
    """The tenant's LoRA (language, vision tower, connector) merged into the exported
    prefix weights: lerobot acts as JoyNexus does with the adapter; the resident and a
    tenant without LoRA are untouched."""
    from joynexus.models.lora import LoRAConfig
    from tests.models.test_lora_vision import randomize

    resident = {k: v.clone() for k, v in _smolvla(base).model.state_dict().items()}
    both = {"top": CameraSpec(height=64, width=64), "wrist": CameraSpec(height=64, width=64)}
    own = schema("own", 6, 6, 4, (64, 64)).model_copy(update={"cameras": both})
    targets = ("q_proj", "v_proj", "o_proj", "down_proj")
    lora = LoRAConfig(rank=4, alpha=8.0, targets=targets, vision=True, vision_projection=True)
    slot = TenantSlot("t", own, base, SmolVLAExpertConfig(lora=lora))
    randomize(slot, 5)  # B nonzero on every adapted layer: the adapter acts
    slot.normalization = NormalizationStats(state=_stats(6, 0.5, 2.0), action=_stats(6, 0.1, 1.0))
    saved = save_slot(slot, tmp_path / "outputs", 1, include_optim=False)
    out = export_lerobot_checkpoint(saved, tmp_path / "exported", base=base)

    original = load_file(str(checkpoint / "model.safetensors"))
    weights = load_file(str(out / "model.safetensors"))
    assert slot.lora is not None and set(weights) == set(original)
    adapted = {f"model.vlm_with_expert.vlm.{n}.weight" for n in slot.lora.module_names}
    assert any(".vision_model." in k for k in adapted) and any(".connector." in k for k in adapted)
    # Exactly the adapted layers differ (the expert is the checkpoint's, untrained here).
    assert {k for k, v in weights.items() if not torch.equal(v, original[k])} == adapted
    after = _smolvla(base).model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in resident.items())

    mine, theirs = _ours_and_lerobots(base, slot, out, tmp_path)
    assert (mine - theirs).abs().max().item() <= 1e-4
    # Not vacuous: without its adapter the same tenant acts otherwise.
    plain = TenantSlot("p", own, base, SmolVLAExpertConfig())
    plain.normalization = slot.normalization
    assert (_ours_and_lerobots(base, plain, None, tmp_path)[0] - theirs).abs().max() > 1e-3
    # Without LoRA the export is the checkpoint's prefix, bit for bit.
    bare = save_slot(plain, tmp_path / "outputs", 1, include_optim=False)
    plain_out = load_file(
        str(export_lerobot_checkpoint(bare, tmp_path / "plain", base=base) / "model.safetensors")
    )
    assert all(torch.equal(v, original[k]) for k, v in plain_out.items())


def test_a_lora_layer_that_cannot_be_merged_refuses_the_export(base: ResidentBaseModel) -> None:
    from joynexus.models.checkpoints.lerobot_export import merged_lora

    name = "model.text_model.layers.0.self_attn.q_proj"
    weight = _smolvla(base).model.state_dict()[f"model.vlm_with_expert.vlm.{name}.weight"]
    merged = merged_lora(_smolvla(base), {name: torch.ones_like(weight)})
    assert torch.equal(next(iter(merged.values())), weight + 1)
    for bad in ("model.text_model.layers.99.self_attn.q_proj", name):
        wrong = torch.zeros(3, 5)
        with pytest.raises(InvalidRequestError, match=re.escape(repr(bad))):
            merged_lora(_smolvla(base), {bad: wrong})


def test_a_tenant_without_statistics_takes_the_checkpoints(base: ResidentBaseModel) -> None:
    from joynexus.services.tenancy import TenantConfig, build_slot

    fits = schema("fits", 6, 6, 4, (64, 64))
    slot = build_slot(TenantConfig(tenant_id="n", schema=fits, head=SmolVLAExpertConfig()), base)
    assert slot.normalization is not None
    stats = _smolvla(base).ckpt.stats
    assert slot.normalization.action.mean == pytest.approx(stats["action"]["mean"])
    assert slot.normalization.state is not None
    assert slot.normalization.state.std == pytest.approx(stats["observation.state"]["std"])
    # The tenant's own statistics win; and a narrower tenant keeps raw units.
    own = NormalizationStats(state=_stats(6, 0.5, 2.0), action=_stats(6, 0.1, 1.0))
    config = TenantConfig(tenant_id="o", schema=fits, head=SmolVLAExpertConfig(), normalization=own)
    assert build_slot(config, base).normalization == own
    narrow = TenantConfig(tenant_id="m", schema=SCHEMAS["b"], head=SmolVLAExpertConfig())
    assert build_slot(narrow, base).normalization is None


def _text(output: str) -> str:
    """A CLI error's text without the box it is drawn in (its lines joined)."""
    return " ".join(output.replace("│", " ").split())


def test_models_export_cli_writes_the_tenants_lerobot_directory(
    base: ResidentBaseModel, checkpoint: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from joynexus.cli.main import app

    slot = TenantSlot("t", SCHEMAS["c"], base, SmolVLAExpertConfig(), optimizer=OptimizerConfig())
    GroupedExecutor(base, [slot]).train_step(
        {"t": ObservationBatch.synthetic(SCHEMAS["c"], 2, seed=0)}
    )
    save_slot(slot, tmp_path / "outputs", 1, include_optim=False)
    out = tmp_path / "policy"
    common = ["--outputs", str(tmp_path / "outputs"), "--base-model", str(checkpoint)]
    args = ["models", "export", "--format", "lerobot", "--tenant", "t", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, *common])
    assert result.exit_code == 0, result.output
    # The tenant's cameras and image size (recorded in its checkpoint), not the base's.
    assert _images(out) == {"observation.images.top": [3, 96, 96]} != _images(checkpoint)
    weights = load_file(str(out / "model.safetensors"))
    expert = slot.action_module
    assert isinstance(expert, SmolVLAExpert)
    assert all(torch.equal(weights[k], v) for k, v in expert.expert_state().items())
    original = load_file(str(checkpoint / "model.safetensors"))
    assert len(weights) == len(original)
    # Without LoRA the prefix is the checkpoint's, bit for bit.
    prefix = set(original) - set(expert.expert_state())
    assert all(torch.equal(weights[k], original[k]) for k in prefix)
    # Another head's checkpoint is refused with the reason; an unknown format too.
    oft = TenantSlot("o", SCHEMAS["c"], base, OFTHeadConfig(hidden_dim=16, num_blocks=1))
    save_slot(oft, tmp_path / "outputs", 1, include_optim=False)
    args = ["models", "export", "--tenant", "o", "--out", str(tmp_path / "x"), *common]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "only a 'smolvla_expert' exports" in _text(result.output)
    result = CliRunner().invoke(app, [*args, "--format", "onnx"])
    assert result.exit_code != 0 and "lerobot" in result.output


def _images(policy: Path) -> dict[str, list[int]]:
    """A LeRobot policy directory's image input features: name → shape."""
    features = json.loads((policy / "config.json").read_text())["input_features"]
    return {k: v["shape"] for k, v in features.items() if k.startswith("observation.images.")}


def test_an_old_checkpoint_without_its_schema_exports_the_bases_images_with_a_note(
    base: ResidentBaseModel, checkpoint: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from joynexus.cli.main import app

    slot = TenantSlot("t", SCHEMAS["c"], base, SmolVLAExpertConfig())
    saved = save_slot(slot, tmp_path / "outputs", 1, include_optim=False)
    manifest = json.loads((saved / "manifest.json").read_text())
    assert manifest["data_schema"]["cameras"] == {"top": {"height": 96, "width": 96, "channels": 3}}
    del manifest["data_schema"]  # as written before manifests recorded the schema
    (saved / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "policy"
    args = ["models", "export", "--checkpoint", str(saved), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--base-model", str(checkpoint)])
    assert result.exit_code == 0, result.output
    assert "predates recorded tenant schemas" in _text(result.output)
    assert _images(out) == _images(checkpoint)


def test_an_exported_smolvla_loads_back_from_any_working_directory(
    base: ResidentBaseModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slot = TenantSlot("t", SCHEMAS["b"], base, SmolVLAExpertConfig(), seed=3)
    saved = save_slot(slot, tmp_path / "outputs", 1, include_optim=False)
    out = export_lerobot_checkpoint(saved, tmp_path / "exported", base=base)
    assert json.loads((out / "config.json").read_text())["vlm_model_name"] == "vlm"
    # A direct export takes the tenant's schema from its checkpoint too.
    assert _images(out) == {"observation.images.top": [3, 48, 64]}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # "vlm" does not exist here: only the export has it
    loaded = ResidentBaseModel.from_pretrained(str(out))
    expert = slot.action_module
    assert isinstance(expert, SmolVLAExpert)
    state = _smolvla(loaded).model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in expert.expert_state().items())


def test_vision_lora_on_the_smolvla_prefix_grouped_equals_serial(base: ResidentBaseModel) -> None:
    from joynexus.models.lora import LoRAConfig
    from tests.models.test_lora import _adapter_grads, _feature_loss
    from tests.models.test_lora_vision import randomize

    lora = LoRAConfig(rank=4, alpha=8.0, targets=("q_proj",), vision=True, vision_projection=True)
    slots = [
        TenantSlot(t, s, base, SmolVLAExpertConfig(lora=None if t == "b" else lora), seed=i)
        for i, (t, s) in enumerate(SCHEMAS.items())
    ]
    for i, slot in enumerate(slots):
        if slot.lora is not None:
            randomize(slot, 10 + i, only="vision_model")  # changes come through the images
    ex = GroupedExecutor(base, slots)
    batches = _batches()
    grouped = ex.shared_forward(batches, grad=True)
    torch.autograd.backward(torch.stack([_feature_loss(f) for f in grouped.values()]).sum())
    grouped_grads = _adapter_grads(ex)
    bare = ex.shared_forward(batches, adapters=dict.fromkeys(batches))
    for t, batch in batches.items():
        serial = ex.shared_forward({t: batch}, grad=True)[t]
        if ex.slot(t).lora is not None:
            torch.autograd.backward(_feature_loss(serial))
        g, s = grouped[t].hidden_states.detach(), serial.hidden_states.detach()
        gm, sm = grouped[t].attention_mask.bool(), serial.attention_mask.bool()
        for row in range(int(gm.shape[0])):
            assert _rel(g[row][gm[row]], s[row][sm[row]]) <= REL, t
        changed = float((g - bare[t].hidden_states).abs().max())
        assert (changed > 1e-3) == (t != "b"), f"{t}: vision adapter effect {changed}"
    for t, grads in _adapter_grads(ex).items():
        for name, grad in grads.items():
            assert _rel(grouped_grads[t][name], grad) <= REL, f"{t}/{name}"
        assert any("vision_model" in n and float(g.norm()) > 0 for n, g in grads.items())
