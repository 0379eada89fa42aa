"""π0 in: what lerobot 0.6.1 saved as a ``pi0`` policy, JoyNexus loads (the shared
PaliGemma prefix, a ``pi0_expert`` tenant's copy of the expert) and predicts with, the
same actions.

Needs the reference environment (``make install`` builds it:
scripts/install-lerobot-reference.sh); without it these tests FAIL and say why — they
never skip. The tiny π0 is lerobot's own ``PI0Config(paligemma_variant="gemma_300m",
action_expert_variant="gemma_300m")``, shrunk inside the reference process only, after
the config is constructed, exactly as the π0.5 one (tests/interop/test_lerobot_pi05.py's
docstring: prefix Gemma 64 wide, 2 layers; expert 32 wide, 2 layers; a 1-layer SigLIP
of 8 px patches); every class that computes is lerobot's, unmodified. 32 px cameras,
chunk 4, 3 denoising steps, a 48-token prompt, fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from joynexus.errors import SpecError
from joynexus.models.archs.lerobot_pi import PI0_ARCH, LeRobotPiPrefix
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.policies.pi0_expert import LeRobotPi0Expert, Pi0ExpertConfig
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot
from tests.interop.lerobot_helpers import TASKS
from tests.interop.lerobot_pi_helpers import (
    SIDE,
    joynexus_pi_answer,
    lerobot_pi_answer,
    pi_schema,
    tiny_pi0,
)

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pi0")


@pytest.fixture(scope="module")
def checkpoint(work: Path) -> Path:
    """A tiny π0 saved by lerobot 0.6.1 itself (see the module docstring)."""
    return tiny_pi0(work / "pi0")


def test_lerobot_061_pi0_actions_are_joynexus_actions(checkpoint: Path, work: Path) -> None:
    """In: for the same observation and noise, JoyNexus's π0 (the shared prefix over
    the instruction's prompt, a tenant's copy of the expert with the state as its own
    token) predicts lerobot 0.6.1's ``select_action`` actions, processors included."""
    answer = lerobot_pi_answer(checkpoint, work, TASKS, side=SIDE)
    base = ResidentBaseModel.from_pretrained(str(checkpoint))
    assert isinstance(base.resident, LeRobotPiPrefix) and base.arch == PI0_ARCH
    schema = pi_schema()
    slot = TenantSlot("t", schema, base, Pi0ExpertConfig(), optimizer=OptimizerConfig(lr=1e-3))
    # lerobot's π0 processor normalizes by mean and standard deviation.
    slot.normalization = base.default_normalization(schema)
    assert slot.normalization is not None and slot.normalization.mode == "mean_std"
    expert = slot.action_module
    assert isinstance(expert, LeRobotPi0Expert)
    mine = joynexus_pi_answer(base, slot, answer, TASKS)
    # The prompts are the instructions (newline-terminated), tokenized as lerobot did.
    assert torch.equal(mine.input_ids, answer.tokens)
    theirs = answer.actions
    assert theirs.shape == mine.actions.shape == (2, 4, 6)
    difference = (mine.actions - theirs).abs().max().item()
    print(f"largest action difference, JoyNexus vs lerobot 0.6.1 pi0: {difference:.3g}")
    assert difference <= TOLERANCE
    # Not vacuous: the rows (different observations) act differently, and the state
    # reaches the expert as its own token (not through the prompt).
    assert (theirs[0] - theirs[1]).abs().max() > 1e-3
    with torch.no_grad():
        stateless = expert.denoise(mine.features, torch.zeros(2, 6), answer.noise)
    assert (stateless - mine.chunk).abs().max() > 1e-4


def test_a_schema_wider_than_the_pi0_checkpoint_is_a_spec_error(checkpoint: Path) -> None:
    base = ResidentBaseModel.from_pretrained(str(checkpoint))
    with pytest.raises(SpecError, match="max_action_dim of 8") as info:
        Pi0ExpertConfig().check_base(base, pi_schema(action_dim=9))
    assert "π0 checkpoint" in str(info.value)
