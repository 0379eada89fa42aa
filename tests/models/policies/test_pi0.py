"""π0 as a resident model: shared PaliGemma prefix, tenant-private action experts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from joynexus.errors import SpecError
from joynexus.models.archs.paligemma.pi0 import EXPERT_PREFIXES, Pi0Checkpoint
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.feature import max_abs_diff_left_padded
from joynexus.models.checkpoints.pi0_export import export_pi0
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.policies import (
    FlowMatchingHeadConfig,
    OFTHeadConfig,
    Pi0Expert,
    Pi0ExpertConfig,
)
from joynexus.models.schema import CALVIN, LIBERO, PUSHT, DataSchema
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot
from joynexus.models.types import BackboneOutput
from tests.models.conftest import TinyBackbone, TinyModelDir
from tests.models.reference import apply_loss, grouped_predict, serial_forward, serial_predict

REL = 1e-5
SCHEMAS = {"libero": LIBERO, "calvin": CALVIN, "pusht": PUSHT}


def _pi0(base: ResidentBaseModel) -> Pi0Checkpoint:
    """The resident model's Pi0Checkpoint (the extension its family asks for)."""
    found = base.extension(Pi0Checkpoint)
    assert found is not None
    return found


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _batches(n: int = 2) -> dict[str, ObservationBatch]:
    out = {
        tid: ObservationBatch.synthetic(s, n, seed=i) for i, (tid, s) in enumerate(SCHEMAS.items())
    }
    # Instructions of different lengths: rows need different amounts of prefix padding.
    out["libero"] = dataclasses.replace(
        out["libero"], instructions=["open", "put the bowl on the plate " * 3][:n]
    )
    return out


def _executor(base: object, head: Pi0ExpertConfig | None = None) -> GroupedExecutor:
    slots = [
        TenantSlot(tid, schema, base, head or Pi0ExpertConfig(), seed=i)
        for i, (tid, schema) in enumerate(SCHEMAS.items())
    ]
    return GroupedExecutor(base, slots)


def test_tenant_expert_starts_from_the_checkpoints_expert(
    tiny_backbone: TinyBackbone, tiny_model_dir: TinyModelDir
) -> None:
    from transformers import PI0ForConditionalGeneration

    base = tiny_backbone("pi0")
    assert base.arch == "pi0" and base.extension(Pi0Checkpoint) is not None
    policy = PI0ForConditionalGeneration.from_pretrained(tiny_model_dir("pi0"))
    reference = {k: v for k, v in policy.state_dict().items() if k.startswith(EXPERT_PREFIXES)}
    slot = TenantSlot("a", LIBERO, base, Pi0ExpertConfig())
    expert = slot.action_module
    assert isinstance(expert, Pi0Expert)
    state = expert.expert_state()
    # Every expert tensor but the (unused) token embedding, equal to the checkpoint's.
    assert set(reference) - set(state) == {"model.dit.embed_tokens.weight"}
    assert all(torch.equal(state[k], reference[k]) for k in state)
    # The resident model holds the prefix only; a random-init expert differs.
    assert not any(n.startswith("dit.") for n, _ in base.model.named_parameters())
    fresh = TenantSlot("b", LIBERO, base, Pi0ExpertConfig(init="random"), seed=3)
    other = fresh.action_module.state_dict()
    assert any(not torch.equal(other[k], state[k]) for k in state)


def test_grouped_equals_serial_features_actions_and_losses(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("pi0")
    ex = _executor(base)
    batches = _batches()
    grouped, serial = ex.shared_forward(batches), serial_forward(ex, batches)
    lengths = {tid: int(out.attention_mask.shape[1]) for tid, out in serial.items()}
    assert len(set(lengths.values())) > 1, "tenants should need different prefix lengths"
    for tid in batches:
        g, s = grouped[tid], serial[tid]
        diff = max_abs_diff_left_padded(
            g.hidden_states, g.attention_mask, s.hidden_states, s.attention_mask
        )
        assert diff <= REL * float(s.hidden_states.abs().max())
        assert g.prefix_kv is not None and s.prefix_kv is not None
        n = s.attention_mask.shape[1]
        real = s.attention_mask.bool()
        for (gk, gv), (sk, sv) in zip(g.prefix_kv, s.prefix_kv, strict=True):
            # Right-aligned (left padding), compared at real tokens only.
            for a, b in ((gk, sk), (gv, sv)):
                a_real = a[:, :, -n:].transpose(1, 2)[real]
                b_real = b.transpose(1, 2)[real]
                assert _rel(a_real, b_real) <= REL

    def gens() -> dict[str, torch.Generator]:
        return {tid: torch.Generator().manual_seed(7) for tid in batches}

    pg, ps = (
        grouped_predict(ex, batches, generators=gens()),
        serial_predict(ex, batches, generators=gens()),
    )
    for tid, schema in SCHEMAS.items():
        assert pg[tid].shape == (2, schema.action_chunk, schema.action_dim)
        assert _rel(pg[tid], ps[tid]) <= REL

    # Losses (and the steps they drive): two executors with identical slots.
    grouped_steps = _executor(base).train_step(batches)
    serial_steps = _executor(base).serial_train_step(batches)
    for tid in batches:
        g_loss, s_loss = grouped_steps[tid].loss, serial_steps[tid].loss
        assert abs(g_loss - s_loss) <= REL * abs(s_loss)
        assert grouped_steps[tid].policy_version == 1


def test_sft_steps_the_tenants_expert_only(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("pi0")
    before = {n: p.detach().clone() for n, p in base.model.named_parameters()}
    template = {k: v.clone() for k, v in _pi0(base).expert_state.items()}
    slot = TenantSlot("a", LIBERO, base, Pi0ExpertConfig(), optimizer=OptimizerConfig(lr=1e-3))
    other = TenantSlot("b", LIBERO, base, Pi0ExpertConfig())
    other_before = {k: v.clone() for k, v in other.action_module.state_dict().items()}
    ex = GroupedExecutor(base, [slot, other])
    batch = ObservationBatch.synthetic(LIBERO, 4, seed=3)
    assert batch.actions is not None
    features = ex.shared_forward({"a": batch})["a"]
    state, actions = torch.from_numpy(batch.state), torch.from_numpy(batch.actions)

    def fixed_loss() -> torch.Tensor:
        # The same noise and times every time: only the weights change.
        gen = torch.Generator().manual_seed(0)
        return slot.action_module.loss(features, state, actions, generator=gen)

    start = float(fixed_loss().detach())
    for _ in range(3):
        apply_loss(slot, fixed_loss())
    # Its own gradient steps lower the tenant's flow-matching loss.
    assert float(fixed_loss().detach()) < 0.95 * start
    ex.train_step({"a": batch})  # the grouped path steps it too
    assert all(torch.equal(p, before[n]) for n, p in base.model.named_parameters())
    assert all(torch.equal(v, template[k]) for k, v in _pi0(base).expert_state.items())
    assert all(torch.equal(v, other_before[k]) for k, v in other.action_module.state_dict().items())
    changed = [
        k for k, v in slot.action_module.state_dict().items() if not torch.equal(v, template[k])
    ]
    assert any(k.startswith("model.dit.layers") for k in changed)
    assert slot.policy_version == 4 and other.policy_version == 0


def test_other_heads_run_on_the_pi0_prefix(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("pi0")
    heads = [OFTHeadConfig(), FlowMatchingHeadConfig(num_inference_steps=2), Pi0ExpertConfig()]
    slots = [TenantSlot(f"t{i}", PUSHT, base, h, seed=i) for i, h in enumerate(heads)]
    ex = GroupedExecutor(base, slots)
    batch = ObservationBatch.synthetic(PUSHT, 2, seed=1)
    out = grouped_predict(ex, {s.tenant_id: batch for s in slots})
    assert all(a.shape == (2, PUSHT.action_chunk, PUSHT.action_dim) for a in out.values())
    steps = ex.train_step({s.tenant_id: batch for s in slots})
    assert all(r.policy_version == 1 for r in steps.values())


def test_num_inference_steps_is_per_tenant(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("pi0")
    default = TenantSlot("a", PUSHT, base, Pi0ExpertConfig())
    quick = TenantSlot("b", PUSHT, base, Pi0ExpertConfig(num_inference_steps=2))
    assert isinstance(default.action_module, Pi0Expert)
    assert isinstance(quick.action_module, Pi0Expert)
    assert default.action_module.num_inference_steps == _pi0(base).num_inference_steps
    assert quick.action_module.num_inference_steps == 2
    calls: list[int] = []
    expert = quick.action_module
    original = expert.velocity

    def counting(*args: object) -> torch.Tensor:
        calls.append(1)
        return original(*args)

    expert.velocity = counting  # type: ignore[method-assign]
    ex = GroupedExecutor(base, [quick])
    grouped_predict(ex, {"b": ObservationBatch.synthetic(PUSHT, 1, seed=0)})
    assert len(calls) == 2


def test_export_is_a_complete_pi0_that_plain_transformers_samples_identically(
    tiny_backbone: TinyBackbone, tmp_path: Path
) -> None:
    from transformers import AutoProcessor, PI0ForConditionalGeneration

    base = tiny_backbone("pi0")
    slot = TenantSlot("a", CALVIN, base, Pi0ExpertConfig(), optimizer=OptimizerConfig(lr=1e-3))
    ex = GroupedExecutor(base, [slot])
    batch = ObservationBatch.synthetic(CALVIN, 2, seed=5)
    for _ in range(2):
        ex.train_step({"a": batch})  # the exported expert is the tenant's, not the template
    expert = slot.action_module
    assert isinstance(expert, Pi0Expert)
    out = export_pi0(_pi0(base), base.processor, expert.expert_state(), tmp_path / "policy")

    policy = PI0ForConditionalGeneration.from_pretrained(out).eval()
    processor = AutoProcessor.from_pretrained(out)
    assert type(processor).__name__ == "PI0Processor"
    feature = base.canonicalize([("a", CALVIN, batch)])
    features = base.encode(feature)
    noise = torch.randn(
        2,
        _pi0(base).chunk_size,
        _pi0(base).max_action_dim,
        generator=torch.Generator().manual_seed(1),
    )
    state = torch.from_numpy(batch.state)
    ours = expert.denoise(features, state, noise)
    inputs = feature.model_inputs
    padded_state = torch.nn.functional.pad(state, (0, _pi0(base).max_state_dim - state.shape[1]))
    theirs = policy.sample_actions(
        state=padded_state,
        input_ids=inputs["input_ids"],
        pixel_values=inputs["pixel_values"],
        noise=noise,
        attention_mask=inputs["attention_mask"],
        pixel_attention_mask=inputs["pixel_attention_mask"],
    )
    assert _rel(ours, theirs) <= REL
    # Not vacuous: the template expert samples something else from the same noise.
    template = TenantSlot("t", CALVIN, base, Pi0ExpertConfig()).action_module
    assert isinstance(template, Pi0Expert)
    assert _rel(template.denoise(features, state, noise), theirs) > 1e-3


def _wide(action_dim: int, chunk: int) -> DataSchema:
    return PUSHT.model_copy(
        update={"name": "wide", "action_dim": action_dim, "action_chunk": chunk}
    )


def test_schemas_the_checkpoint_cannot_serve_are_refused(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("pi0")
    too_wide = _wide(_pi0(base).max_action_dim + 1, 4)
    with pytest.raises(SpecError, match="max_action_dim of 32") as info:
        TenantSlot("a", too_wide, base, Pi0ExpertConfig())
    assert info.value.details["fields"] == ["schema.action_dim"]
    too_long = _wide(2, _pi0(base).chunk_size + 1)
    with pytest.raises(SpecError, match="chunk_size of 16") as info:
        TenantSlot("a", too_long, base, Pi0ExpertConfig())
    assert info.value.details["fields"] == ["schema.action_chunk"]
    # A fresh head has no such limit on the same prefix.
    TenantSlot("a", too_long, base, OFTHeadConfig())


def test_a_checkpoint_whose_flow_times_the_expert_cannot_draw_is_refused(
    tiny_backbone: TinyBackbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A π0 checkpoint trained on Beta(α, β ≠ 1) flow times: a clear SpecError (a 4xx at
    the API), not an internal error while the slot is built."""
    base = tiny_backbone("pi0")
    monkeypatch.setattr(_pi0(base).config, "time_sampling_beta_beta", 1.5)
    with pytest.raises(SpecError, match=r"beta=1\.5") as info:
        TenantSlot("a", PUSHT, base, Pi0ExpertConfig())
    assert info.value.details["fields"] == ["action_module.type"]
    TenantSlot("a", PUSHT, base, OFTHeadConfig())  # a fresh head is unaffected


def test_pi0_expert_needs_a_pi0_base(tiny_backbone: TinyBackbone) -> None:
    with pytest.raises(SpecError, match="needs a π0 base model"):
        TenantSlot("a", PUSHT, tiny_backbone("paligemma"), Pi0ExpertConfig())


def test_the_expert_refuses_features_without_a_prefix_cache(tiny_backbone: TinyBackbone) -> None:
    slot = TenantSlot("a", PUSHT, tiny_backbone("pi0"), Pi0ExpertConfig())
    features = BackboneOutput(torch.zeros(1, 3, 128), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="prefix KV cache"):
        slot.predict(features, torch.zeros(1, PUSHT.state_dim))


def test_flow_sde_chain_log_prob_matches_the_sampler_and_the_ode_limit(
    tiny_backbone: TinyBackbone,
) -> None:
    base = tiny_backbone("pi0")
    slot = TenantSlot("a", PUSHT, base, Pi0ExpertConfig(num_inference_steps=4))
    expert = slot.action_module
    assert isinstance(expert, Pi0Expert)
    batch = ObservationBatch.synthetic(PUSHT, 3, seed=2)
    features = GroupedExecutor(base, [slot]).shared_forward({"a": batch})["a"]
    state = torch.from_numpy(batch.state)
    actions, log_prob, chain = expert.sample(
        features, state, generator=torch.Generator().manual_seed(0)
    )
    assert actions.shape == (3, PUSHT.action_chunk, PUSHT.action_dim)
    assert chain.shape == (3, 5, expert.chunk_size, expert.max_action_dim)
    assert torch.equal(chain[:, -1, : PUSHT.action_chunk, : PUSHT.action_dim], actions)
    # The recorded chain's log-probability under the weights that sampled it: ratio 1.
    recomputed = expert.log_prob(features, state, chain)
    assert torch.allclose(recomputed, log_prob, rtol=1e-4, atol=1e-3)
    # With a vanishing noise level the chain mean is π0's own Euler sampler.
    quiet = Pi0Expert(
        Pi0ExpertConfig(num_inference_steps=4, sde_noise_level=1e-6),
        pi0=_pi0(base),
        hidden_size=base.hidden_size,
        state_dim=PUSHT.state_dim,
        action_dim=PUSHT.action_dim,
        action_chunk=PUSHT.action_chunk,
    )
    _, _, ode_chain = quiet.sample(features, state, generator=torch.Generator().manual_seed(0))
    ode = quiet.denoise(features, state, ode_chain[:, 0])
    assert _rel(ode_chain[:, -1], ode) <= 1e-4


def test_a_policy_gradient_step_follows_the_advantage(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("pi0")
    slot = TenantSlot(
        "a", PUSHT, base, Pi0ExpertConfig(num_inference_steps=3), optimizer=OptimizerConfig(lr=1e-4)
    )
    expert = slot.action_module
    assert isinstance(expert, Pi0Expert)
    batch = ObservationBatch.synthetic(PUSHT, 4, seed=4)
    features = GroupedExecutor(base, [slot]).shared_forward({"a": batch})["a"]
    state = torch.from_numpy(batch.state)
    _, old, chain = expert.sample(features, state, generator=torch.Generator().manual_seed(1))
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    for _ in range(2):
        apply_loss(slot, -(advantages * expert.log_prob(features, state, chain)).mean())
    with torch.no_grad():
        change = expert.log_prob(features, state, chain) - old
    # The advantage-weighted log-likelihood went up: the policy moved its way.
    assert float((advantages * change).sum()) > 0


def test_export_pi0_cli_writes_a_tenant_checkpoint_as_a_policy(
    tiny_backbone: TinyBackbone, tiny_model_dir: TinyModelDir, tmp_path: Path
) -> None:
    from transformers import AutoProcessor, PI0ForConditionalGeneration
    from typer.testing import CliRunner

    from joynexus.cli.main import app
    from joynexus.models.normalization import FeatureNormStats, NormalizationStats
    from tests.models.reference import save_slot

    base = tiny_backbone("pi0")
    slot = TenantSlot("a", PUSHT, base, Pi0ExpertConfig(), optimizer=OptimizerConfig(lr=1e-3))
    batch = ObservationBatch.synthetic(PUSHT, 2, seed=8)
    GroupedExecutor(base, [slot]).train_step({"a": batch})
    # A constant action dimension (std 0): the exported processor gets the floored scale.
    flat = {"mean": [0.5, -1.0], "std": [0.2, 0.0], "q01": [0.1, -1.0], "q99": [0.9, -1.0]}
    slot.normalization = NormalizationStats(action=FeatureNormStats(**flat))
    ckpt = save_slot(slot, tmp_path / "outputs", step=1)
    out = tmp_path / "policy"
    args = ["models", "export-pi0", "--checkpoint", str(ckpt), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--base-model", str(tiny_model_dir("pi0"))])
    assert result.exit_code == 0, result.output
    exported_std = AutoProcessor.from_pretrained(out).actions_std
    assert exported_std[0] == pytest.approx(0.2) and 0 < exported_std[1] < 0.01
    policy = PI0ForConditionalGeneration.from_pretrained(out).eval()
    expert = slot.action_module
    assert isinstance(expert, Pi0Expert)
    exported = {k: v for k, v in policy.state_dict().items() if k.startswith(EXPERT_PREFIXES)}
    assert all(torch.equal(exported[k], v) for k, v in expert.expert_state().items())
    # A checkpoint of another head is refused with the reason.
    oft = TenantSlot("b", PUSHT, base, OFTHeadConfig())
    other = save_slot(oft, tmp_path / "outputs", step=1)
    result = CliRunner().invoke(
        app,
        [
            "models",
            "export-pi0",
            "--checkpoint",
            str(other),
            "--out",
            str(tmp_path / "x"),
            "--base-model",
            str(tiny_model_dir("pi0")),
        ],
    )
    assert result.exit_code != 0 and "only a 'pi0_expert' exports" in result.output
