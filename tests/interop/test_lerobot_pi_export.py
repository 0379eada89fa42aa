"""π0 and π0.5 out: a JoyNexus ``pi0_expert`` / ``pi05_expert`` tenant on a LeRobot
checkpoint exported with ``--format lerobot``, moved, and run by lerobot 0.6.1 itself
gives JoyNexus's actions.

Needs the reference environment (``make install`` builds it:
scripts/install-lerobot-reference.sh); without it these tests FAIL and say why — they
never skip. The tiny π0 / π0.5 are lerobot's own classes, shrunk inside the reference
process (how: tests/interop/test_lerobot_pi05.py's docstring); the export carries the
sizes in its ``joynexus.json``, which the side script reads to shrink the same way on
load.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from joynexus.errors import InvalidRequestError
from joynexus.models.archs.lerobot_pi.checkpoint import LeRobotPiCheckpoint
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.lerobot_export import export_lerobot_checkpoint
from joynexus.models.checkpoints.lerobot_pi_export import policy_tensors
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.lora import LoRAConfig
from joynexus.models.normalization import FeatureNormStats, NormalizationStats
from joynexus.models.policies.base import PolicyConfig
from joynexus.models.policies.pi0_expert import LeRobotPi0Expert, Pi0ExpertConfig
from joynexus.models.policies.pi05_expert import Pi05Expert, Pi05ExpertConfig
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot
from joynexus.models.types import extension_of
from tests.interop.lerobot_helpers import TASKS, assert_no_absolute_paths
from tests.interop.lerobot_pi_helpers import (
    SIDE,
    joynexus_pi_answer,
    lerobot_pi_answer,
    pi_schema,
    tiny_pi0,
    tiny_pi05,
)
from tests.models.reference import save_slot
from tests.models.test_lora_vision import randomize


@dataclass(frozen=True)
class Family:
    """What differs between the π0 and π0.5 round trips."""

    name: str
    build: object  # the tiny checkpoint's builder
    head: type[PolicyConfig]
    expert: type
    mode: str  # the tenant's own normalization mode (the processor's)
    foreign: str  # a projection of the other family, which this one has no place for


FAMILIES = {
    "pi0": Family(
        "pi0", tiny_pi0, Pi0ExpertConfig, LeRobotPi0Expert, "mean_std", "time_mlp_in.weight"
    ),
    "pi05": Family(
        "pi05", tiny_pi05, Pi05ExpertConfig, Pi05Expert, "quantile", "state_proj.weight"
    ),
}
TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> Family:
    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, family: Family) -> Path:
    return tmp_path_factory.mktemp(f"{family.name}_out")


@pytest.fixture(scope="module")
def base(work: Path, family: Family) -> ResidentBaseModel:
    build = family.build
    assert callable(build)
    return ResidentBaseModel.from_pretrained(str(build(work / family.name)))


def _stats(dim: int, center: float, half: float) -> FeatureNormStats:
    mean = [center + 0.1 * i for i in range(dim)]
    std = [half + 0.2 * i for i in range(dim)]
    return FeatureNormStats(
        mean=mean,
        std=std,
        q01=[m - s for m, s in zip(mean, std, strict=True)],
        q99=[m + s * 1.5 for m, s in zip(mean, std, strict=True)],
    )


def _tenant(base: ResidentBaseModel, family: Family) -> TenantSlot:
    """A tenant with statistics of its own (not the checkpoint's), a LoRA on the shared
    prefix's language model, and an expert trained two steps away from the checkpoint's."""
    schema = pi_schema()
    lora = LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    config = family.head(lora=lora)
    slot = TenantSlot("t", schema, base, config, optimizer=OptimizerConfig(lr=1e-3))
    slot.normalization = NormalizationStats(
        mode=family.mode, state=_stats(6, 0.3, 1.5), action=_stats(6, -0.2, 0.8)
    )
    randomize(slot, 10, only="language_model")
    executor = GroupedExecutor(base, [slot])
    for _ in range(2):
        executor.train_step({"t": ObservationBatch.synthetic(schema, 2, seed=4)})
    return slot


def test_a_moved_export_runs_in_lerobot_061_with_joynexus_actions(
    base: ResidentBaseModel, work: Path, family: Family
) -> None:
    """Out: a trained tenant (own statistics, LoRA on the prefix) exported, the folder
    copied elsewhere and the original deleted; lerobot 0.6.1's ``from_pretrained`` +
    ``make_pre_post_processors`` + ``select_action`` on the copy, run from it, give
    JoyNexus's actions for the same observation and noise."""
    pi = extension_of(base, LeRobotPiCheckpoint)
    assert pi is not None and family.name == pi.TYPE
    slot = _tenant(base, family)
    expert = slot.action_module
    assert isinstance(expert, family.expert)
    # The export is not the input checkpoint: the tenant's expert moved.
    trained = expert.state_dict()
    moved_by = max(
        float((trained[k].float() - v.float()).abs().max()) for k, v in pi.expert_state.items()
    )
    assert moved_by > 1e-5
    saved = save_slot(slot, work / "outputs", 2, include_optim=False)
    exported = export_lerobot_checkpoint(saved, work / "exported", base=base, schema=slot.schema)
    moved = work / "elsewhere" / f"my-{family.name}"
    shutil.copytree(exported, moved)
    shutil.rmtree(exported)
    files = sorted(str(p.relative_to(moved)) for p in moved.rglob("*") if p.is_file())
    print(f"exported {family.name} files:", ", ".join(files))
    assert {"config.json", "model.safetensors", "joynexus.json"} <= set(files)
    assert "tokenizer/tokenizer.json" in files
    assert_no_absolute_paths(moved)

    answer = lerobot_pi_answer(moved, work, TASKS, side=SIDE)
    mine = joynexus_pi_answer(base, slot, answer, TASKS)
    # lerobot wrote the prompts JoyNexus writes (π0.5: the tenant's statistics
    # discretize the state into them).
    assert torch.equal(mine.input_ids, answer.tokens)
    theirs = answer.actions
    assert theirs.shape == mine.actions.shape == (2, 4, 6)
    difference = (mine.actions - theirs).abs().max().item()
    print(
        f"largest action difference, JoyNexus {family.name} export vs lerobot 0.6.1: "
        f"{difference:.3g}"
    )
    assert difference <= TOLERANCE
    # Not vacuous: without the tenant's LoRA the prefix (and so the actions) differ.
    batch = ObservationBatch(
        cameras={c: p.numpy() for c, p in answer.pixels.items()},
        state=mine.state.numpy(),
        instructions=TASKS,
    )
    bare = GroupedExecutor(base, [slot]).shared_forward({"t": batch}, adapters={"t": None})["t"]
    with torch.no_grad():
        plain = expert.denoise(bare, mine.state, answer.noise)
    assert (plain - mine.chunk).abs().max() > 1e-4
    assert (theirs[0] - theirs[1]).abs().max() > 1e-3


def test_a_lora_layer_the_checkpoint_lacks_refuses_the_export(
    base: ResidentBaseModel, family: Family
) -> None:
    pi = extension_of(base, LeRobotPiCheckpoint)
    assert pi is not None
    name = "language_model.layers.0.self_attn.q_proj"
    tensors = policy_tensors(pi, {}, {})
    key = f"model.paligemma_with_expert.paligemma.model.{name}.weight"
    weight = tensors[key]
    merged = policy_tensors(pi, {}, {name: torch.ones_like(weight)})
    assert torch.equal(merged[key], weight + 1)
    with pytest.raises(InvalidRequestError, match="no weight of shape"):
        policy_tensors(pi, {}, {name: torch.ones(3, 3)})
    with pytest.raises(InvalidRequestError, match="no place for"):
        policy_tensors(pi, {family.foreign: torch.ones(1)}, {})
