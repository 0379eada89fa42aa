"""Against today's lerobot: 0.6.1 (Python 3.13), the reference environment.

``make install`` builds it (scripts/install-lerobot-reference.sh); without it these
tests FAIL and say why — they never skip.

How the model is shrunk: lerobot's π0/π0.5 accept only Gemma 300M/2B, but SmolVLA takes
any VLM. The side script's ``make-tiny``, run INSIDE the reference process, builds lerobot
0.6.1's own ``SmolVLAConfig`` with ``vlm_model_name`` a local tiny SmolVLM (2 text
layers, 64 px, a tokenizer trained offline: :mod:`joynexus.models.tiny`),
``num_vlm_layers=2``, ``expert_width_multiplier=0.75``, chunk 4 and 3 denoising steps,
then ``SmolVLAPolicy(config)`` and ``save_pretrained`` (with its pre/post-processors and
made-up normalization statistics): lerobot's unmodified classes, small.

The checkpoint's vision patches have random position embeddings: JoyNexus runs it with
the patch-position rule of the transformers its lerobot wrote it under (0.6.1:
transformers 5; ``joynexus.models.archs.smolvlm.smolvla.vision_positions``), the rule
lerobot 0.6.1 runs it with. Cameras smaller than the checkpoint's square are read as
lerobot reads them (float frames resized with its padding, ``camera_pixels``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from joynexus.interop.reference import REFERENCE_LEROBOT, reference_problem, run_reference
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.lerobot_export import export_lerobot_checkpoint
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.normalization import FeatureNormStats, NormalizationStats
from joynexus.models.policies.smolvla_expert import SmolVLAExpert, SmolVLAExpertConfig
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot
from tests.interop.lerobot_helpers import TASKS, assert_no_absolute_paths
from tests.models.reference import save_slot

#: The checkpoint's image size; the compared tenants' cameras are smaller (out: 32 px;
#: in: 32 px and a 24 × 32 one), so both sides resize them.
SIDE = 64
OUT_SIDE = 32
SMALL = {"top": (32, 32), "wrist": (24, 32)}
TOLERANCE = 1e-4


def require_reference() -> None:
    """The reference environment must run; the test FAILS (never skips) when not."""
    problem = reference_problem()
    if problem is not None:
        pytest.fail(problem)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reference")


@pytest.fixture(scope="module")
def checkpoint(work: Path) -> Path:
    """A tiny SmolVLA saved by lerobot 0.6.1 itself (see the module docstring)."""
    require_reference()
    out = work / "smolvla"
    args = ["make-tiny", "--family", "smolvla", "--out", str(out), "--seed", "5"]
    run_reference("lerobot_run.py", [*args, "--camera", "top", "--camera", "wrist"], binds=[work])
    return out


def test_the_reference_is_lerobot_061_on_python_313() -> None:
    require_reference()
    versions = run_reference("lerobot_run.py", ["probe"])
    assert versions["lerobot"] == REFERENCE_LEROBOT == "0.6.1"
    assert tuple(int(v) for v in versions["python"].split(".")[:2]) >= (3, 12)
    assert versions["transformers"].startswith("5.")


def _stats(dim: int, center: float, scale: float) -> FeatureNormStats:
    mean = [center + 0.1 * i for i in range(dim)]
    std = [scale + 0.2 * i for i in range(dim)]
    low, high = [m - 2 for m in mean], [m + 2 for m in mean]
    return FeatureNormStats(mean=mean, std=std, q01=low, q99=high)


def _tenant(base: ResidentBaseModel, side: int = SIDE) -> TenantSlot:
    cameras = {c: CameraSpec(height=side, width=side) for c in ("top", "wrist")}
    schema = DataSchema(
        name="own",
        cameras=cameras,
        state_dim=6,
        action_dim=6,
        action_chunk=4,
        fps=10.0,
        instruction="pick up the block",
    )
    slot = TenantSlot("t", schema, base, SmolVLAExpertConfig(), optimizer=OptimizerConfig(lr=1e-3))
    slot.normalization = NormalizationStats(state=_stats(6, 0.5, 2.0), action=_stats(6, 0.1, 1.0))
    executor = GroupedExecutor(base, [slot])
    for _ in range(2):
        executor.train_step({"t": ObservationBatch.synthetic(schema, 2, seed=4)})
    return slot


def test_an_export_moved_elsewhere_loads_in_lerobot_061_with_the_same_actions(
    checkpoint: Path, work: Path
) -> None:
    """Out: JoyNexus reads lerobot 0.6.1's checkpoint, trains a tenant, exports it; the
    folder is copied elsewhere and the original deleted; lerobot 0.6.1's
    ``from_pretrained`` + ``make_pre_post_processors`` + ``select_action`` on the copy
    give JoyNexus's actions for the same observation and noise (32 px cameras on the
    64 px checkpoint: both resize them)."""
    base = ResidentBaseModel.from_pretrained(str(checkpoint))
    slot = _tenant(base, side=OUT_SIDE)
    saved = save_slot(slot, work / "outputs", 2, include_optim=False)
    exported = export_lerobot_checkpoint(saved, work / "exported", base=base, schema=slot.schema)
    moved = work / "elsewhere" / "my-smolvla"
    shutil.copytree(exported, moved)
    shutil.rmtree(exported)

    # Nothing inside names a path of this machine.
    assert_no_absolute_paths(moved)

    g = torch.Generator().manual_seed(11)
    pixels = {
        c: torch.randint(0, 256, (2, OUT_SIDE, OUT_SIDE, 3), generator=g, dtype=torch.uint8)
        for c in ("top", "wrist")
    }
    state = torch.randn(2, 6, generator=g)
    noise = torch.randn(2, 4, 8, generator=g)
    obs = {
        f"observation.images.{c}": (p.permute(0, 3, 1, 2) / 255).contiguous()
        for c, p in pixels.items()
    }
    save_file({**obs, "observation.state": state, "noise": noise}, str(work / "obs.safetensors"))
    (work / "task.json").write_text(json.dumps(TASKS))
    out = work / "actions.safetensors"
    args = ["predict", "--policy", str(moved), "--obs", str(work / "obs.safetensors")]
    args += ["--task", str(work / "task.json"), "--out", str(out), "--select"]
    # lerobot resolves the exported ``vlm_model_name`` ("vlm", the VLM's config and
    # tokenizer carried in the folder) against its working folder: run from the copy.
    run_reference("lerobot_run.py", args, binds=[work], cwd=moved)
    theirs = load_file(str(out))["actions"]

    batch = ObservationBatch(
        cameras={c: p.numpy() for c, p in pixels.items()}, state=state.numpy(), instructions=TASKS
    )
    features = GroupedExecutor(base, [slot]).shared_forward({"t": batch})["t"]
    expert, norm = slot.action_module, slot.normalization
    assert isinstance(expert, SmolVLAExpert) and norm is not None
    model_state = torch.from_numpy(norm.normalize(state.numpy(), "state"))
    with torch.no_grad():
        chunk = expert.denoise(features, model_state, noise)
    mine = torch.from_numpy(norm.unnormalize(chunk[:, :4, :6].numpy(), "action"))
    assert theirs.shape == mine.shape == (2, 4, 6)
    difference = (mine - theirs).abs().max().item()
    print(f"largest action difference, JoyNexus export vs lerobot 0.6.1: {difference:.3g}")
    assert difference <= TOLERANCE
    # Not vacuous: the rows (different observations) act differently.
    assert (theirs[0] - theirs[1]).abs().max() > 1e-3


def test_the_exported_image_features_are_the_tenants_cameras(checkpoint: Path, work: Path) -> None:
    """A tenant whose cameras are 32 px (an env spec's ``image_size: 32``) on a 64 px
    checkpoint exports ``[3, 32, 32]`` image features, in its cameras' order."""
    base = ResidentBaseModel.from_pretrained(str(checkpoint))
    slot = _tenant(base, side=32)
    saved = save_slot(slot, work / "outputs32", 2, include_optim=False)
    out = export_lerobot_checkpoint(saved, work / "exported32", base=base, schema=slot.schema)
    features = json.loads((out / "config.json").read_text())["input_features"]
    assert list(features) == [
        "observation.images.top",
        "observation.images.wrist",
        "observation.state",
    ]
    for camera in ("top", "wrist"):
        assert features[f"observation.images.{camera}"] == {"type": "VISUAL", "shape": [3, 32, 32]}
    assert features["observation.state"]["shape"] == [6]
    # Without schema= the one its checkpoint records (as the CLI exports it) ...
    plain = export_lerobot_checkpoint(saved, work / "plain", base=base)
    assert json.loads((plain / "config.json").read_text())["input_features"] == features
    # ... and a checkpoint written before manifests recorded it keeps the base's.
    manifest = json.loads((saved / "manifest.json").read_text())
    del manifest["data_schema"]
    (saved / "manifest.json").write_text(json.dumps(manifest))
    old = export_lerobot_checkpoint(saved, work / "old", base=base)
    assert json.loads((old / "config.json").read_text())["input_features"][
        "observation.images.top"
    ]["shape"] == [3, 64, 64]


def test_a_tenant_on_lerobot_061s_checkpoint_predicts_lerobots_actions(
    checkpoint: Path, work: Path
) -> None:
    """In: a tenant on the checkpoint lerobot 0.6.1 saved (random vision position
    embeddings), with the checkpoint's own expert and statistics, predicts for cameras
    smaller than the checkpoint's square (32 px, and 24 × 32) what lerobot 0.6.1's
    ``from_pretrained`` + saved processors + ``select_action`` give for the same frames,
    state, task and noise."""
    base = ResidentBaseModel.from_pretrained(str(checkpoint))
    cameras = {c: CameraSpec(height=h, width=w) for c, (h, w) in SMALL.items()}
    schema = DataSchema(name="small", cameras=cameras, state_dim=6, action_dim=6, action_chunk=4)
    slot = TenantSlot("t", schema, base, SmolVLAExpertConfig())
    slot.normalization = base.default_normalization(schema)
    expert, norm = slot.action_module, slot.normalization
    assert isinstance(expert, SmolVLAExpert) and norm is not None

    g = torch.Generator().manual_seed(21)
    pixels = {
        c: torch.randint(0, 256, (2, h, w, 3), generator=g, dtype=torch.uint8)
        for c, (h, w) in SMALL.items()
    }
    state = torch.randn(2, 6, generator=g)
    batch = ObservationBatch(
        cameras={c: p.numpy() for c, p in pixels.items()}, state=state.numpy(), instructions=TASKS
    )
    features = GroupedExecutor(base, [slot]).shared_forward({"t": batch})["t"]
    model_state = torch.from_numpy(norm.normalize(state.numpy(), "state"))
    chunk = expert.predict(features, model_state, generator=torch.Generator().manual_seed(8))
    mine = torch.from_numpy(norm.unnormalize(chunk.numpy(), "action"))
    # The noise predict started from, for lerobot.
    noise = torch.randn((2, 4, 8), generator=torch.Generator().manual_seed(8))

    obs = {
        f"observation.images.{c}": (p.permute(0, 3, 1, 2) / 255).contiguous()
        for c, p in pixels.items()
    }
    save_file({**obs, "observation.state": state, "noise": noise}, str(work / "in.safetensors"))
    (work / "task.json").write_text(json.dumps(TASKS))
    out = work / "in-actions.safetensors"
    args = ["predict", "--policy", str(checkpoint), "--obs", str(work / "in.safetensors")]
    args += ["--task", str(work / "task.json"), "--out", str(out), "--select"]
    run_reference("lerobot_run.py", args, binds=[work])
    theirs = load_file(str(out))["actions"]

    assert theirs.shape == mine.shape == (2, 4, 6)
    difference = (mine - theirs).abs().max().item()
    print(f"largest action difference, JoyNexus in vs lerobot 0.6.1: {difference:.3g}")
    assert difference <= TOLERANCE
    assert (theirs[0] - theirs[1]).abs().max() > 1e-3
