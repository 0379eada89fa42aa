"""π0.5 out: a JoyNexus ``pi05_expert`` tenant exported with ``--format lerobot``, moved,
and run by lerobot 0.6.1 itself gives JoyNexus's actions.

Needs the reference environment (``make install`` builds it:
scripts/install-lerobot-reference.sh); without it these tests FAIL and say why — they
never skip. The tiny π0.5 is lerobot's own classes, shrunk inside the reference process
(how: tests/interop/test_lerobot_pi05.py's docstring); the export carries the sizes in
its ``joynexus.json``, which the side script reads to shrink the same way on load.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from joynexus.errors import InvalidRequestError
from joynexus.models.archs.lerobot_pi.checkpoint import Pi05Checkpoint
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.lerobot_export import export_lerobot_checkpoint
from joynexus.models.checkpoints.lerobot_pi05_export import policy_tensors
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.lora import LoRAConfig
from joynexus.models.normalization import FeatureNormStats, NormalizationStats
from joynexus.models.policies.pi05_expert import Pi05Expert, Pi05ExpertConfig
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot
from joynexus.models.types import extension_of
from tests.interop.lerobot_helpers import TASKS, assert_no_absolute_paths
from tests.interop.lerobot_pi_helpers import CAMERAS, lerobot_pi05_answer, tiny_pi05
from tests.models.reference import save_slot
from tests.models.test_lora_vision import randomize

SIDE = 32
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pi05_out")


@pytest.fixture(scope="module")
def base(work: Path) -> ResidentBaseModel:
    return ResidentBaseModel.from_pretrained(str(tiny_pi05(work / "pi05")))


def _stats(dim: int, center: float, half: float) -> FeatureNormStats:
    mean = [center + 0.1 * i for i in range(dim)]
    std = [half + 0.2 * i for i in range(dim)]
    return FeatureNormStats(
        mean=mean,
        std=std,
        q01=[m - s for m, s in zip(mean, std, strict=True)],
        q99=[m + s * 1.5 for m, s in zip(mean, std, strict=True)],
    )


def _tenant(base: ResidentBaseModel) -> TenantSlot:
    """A tenant with statistics of its own (not the checkpoint's), a LoRA on the shared
    prefix's language model, and an expert trained two steps away from the checkpoint's."""
    schema = DataSchema(
        name="own",
        cameras={c: CameraSpec(height=SIDE, width=SIDE) for c in CAMERAS},
        state_dim=6,
        action_dim=6,
        action_chunk=4,
        fps=10.0,
        instruction=TASKS[0],
    )
    lora = LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    config = Pi05ExpertConfig(lora=lora)
    slot = TenantSlot("t", schema, base, config, optimizer=OptimizerConfig(lr=1e-3))
    slot.normalization = NormalizationStats(
        mode="quantile", state=_stats(6, 0.3, 1.5), action=_stats(6, -0.2, 0.8)
    )
    randomize(slot, 10, only="language_model")
    executor = GroupedExecutor(base, [slot])
    for _ in range(2):
        executor.train_step({"t": ObservationBatch.synthetic(schema, 2, seed=4)})
    return slot


def test_a_moved_pi05_export_runs_in_lerobot_061_with_joynexus_actions(
    base: ResidentBaseModel, work: Path
) -> None:
    """Out: a trained π0.5 tenant (own statistics, LoRA on the prefix) exported, the
    folder copied elsewhere and the original deleted; lerobot 0.6.1's
    ``from_pretrained`` + ``make_pre_post_processors`` + ``select_action`` on the copy,
    run from it, give JoyNexus's actions for the same observation and noise."""
    pi05 = extension_of(base, Pi05Checkpoint)
    assert pi05 is not None
    slot = _tenant(base)
    expert = slot.action_module
    assert isinstance(expert, Pi05Expert)
    # The export is not the input checkpoint: the tenant's expert moved.
    trained = expert.expert_state()
    moved_by = max(
        float((trained[k].float() - v.float()).abs().max()) for k, v in pi05.expert_state.items()
    )
    assert moved_by > 1e-5
    saved = save_slot(slot, work / "outputs", 2, include_optim=False)
    exported = export_lerobot_checkpoint(saved, work / "exported", base=base, schema=slot.schema)
    moved = work / "elsewhere" / "my-pi05"
    shutil.copytree(exported, moved)
    shutil.rmtree(exported)
    files = sorted(str(p.relative_to(moved)) for p in moved.rglob("*") if p.is_file())
    print("exported π0.5 files:", ", ".join(files))
    assert {"config.json", "model.safetensors", "joynexus.json"} <= set(files)
    assert "tokenizer/tokenizer.json" in files
    assert_no_absolute_paths(moved)

    answer = lerobot_pi05_answer(moved, work, TASKS, side=SIDE)
    pixels, state, theirs, noise = answer.pixels, answer.state, answer.actions, answer.noise

    norm = slot.normalization
    assert norm is not None
    model_state = norm.normalize(state.numpy(), "state")
    batch = ObservationBatch(
        cameras={c: p.numpy() for c, p in pixels.items()}, state=model_state, instructions=TASKS
    )
    executor = GroupedExecutor(base, [slot])
    # lerobot wrote the prompts JoyNexus writes (the tenant's statistics discretize the state).
    feature = base.canonicalize([("t", slot.schema, batch)])
    assert torch.equal(feature.model_inputs["input_ids"].cpu(), answer.tokens)
    features = executor.shared_forward({"t": batch})["t"]
    with torch.no_grad():
        chunk = expert.denoise(features, torch.from_numpy(model_state), noise)
    mine = torch.from_numpy(norm.unnormalize(chunk[:, :4, :6].numpy(), "action"))
    assert theirs.shape == mine.shape == (2, 4, 6)
    difference = (mine - theirs).abs().max().item()
    print(f"largest action difference, JoyNexus π0.5 export vs lerobot 0.6.1: {difference:.3g}")
    assert difference <= TOLERANCE
    # Not vacuous: without the tenant's LoRA the prefix (and so the actions) differ.
    bare = executor.shared_forward({"t": batch}, adapters={"t": None})["t"]
    with torch.no_grad():
        plain = expert.denoise(bare, torch.from_numpy(model_state), noise)
    assert (plain - chunk).abs().max() > 1e-4
    assert (theirs[0] - theirs[1]).abs().max() > 1e-3


def test_a_lora_layer_the_pi05_checkpoint_lacks_refuses_the_export(
    base: ResidentBaseModel,
) -> None:
    pi05 = extension_of(base, Pi05Checkpoint)
    assert pi05 is not None
    name = "language_model.layers.0.self_attn.q_proj"
    tensors = policy_tensors(pi05, {}, {})
    key = f"model.paligemma_with_expert.paligemma.model.{name}.weight"
    weight = tensors[key]
    merged = policy_tensors(pi05, {}, {name: torch.ones_like(weight)})
    assert torch.equal(merged[key], weight + 1)
    with pytest.raises(InvalidRequestError, match="no weight of shape"):
        policy_tensors(pi05, {}, {name: torch.ones(3, 3)})
    with pytest.raises(InvalidRequestError, match="no place for"):
        policy_tensors(pi05, {"state_proj.weight": torch.ones(1)}, {})
