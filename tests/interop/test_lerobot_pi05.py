"""π0.5 in: what lerobot 0.6.1 saved, JoyNexus loads and predicts with, the same actions.

Needs the reference environment (``make install`` builds it:
scripts/install-lerobot-reference.sh); without it these tests FAIL and say why — they
never skip.

How the model is shrunk (lerobot's π configs accept only ``gemma_300m`` / ``gemma_2b``):
the side script ``joynexus/interop/side/lerobot_pi.py`` builds lerobot's own
``PI05Config(paligemma_variant="gemma_300m", action_expert_variant="gemma_300m")``,
then, inside the reference process only, after the config is constructed, answers
lerobot's ``get_gemma_config`` with tiny widths and depths (prefix Gemma 64 wide, 2
layers; expert 32 wide, 2 layers) and gives the PaliGemma config lerobot builds a tiny
SigLIP tower (32 wide, 1 layer, 8 px patches, projected to 64) just before lerobot's
``PaliGemmaForConditionalGenerationWithPiGemma`` is made of it. Every class that
computes is lerobot's, unmodified; the adaptive norms' modulation (zero at lerobot's
init) is given random weights so the time conditioning shows. The sizes are recorded in
the folder's ``joynexus.json``, which both sides read. 32 px cameras, chunk 4, 3
denoising steps, a 48-token prompt, fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from joynexus.errors import SpecError
from joynexus.models.archs.lerobot_pi import PI05_ARCH, LeRobotPiPrefix
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.policies.pi05_expert import Pi05Expert, Pi05ExpertConfig
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot
from tests.interop.lerobot_helpers import TASKS
from tests.interop.lerobot_pi_helpers import (
    SIDE,
    joynexus_pi_answer,
    lerobot_pi_answer,
    pi_schema,
    tiny_pi05,
)

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pi05")


@pytest.fixture(scope="module")
def checkpoint(work: Path) -> Path:
    """A tiny π0.5 saved by lerobot 0.6.1 itself (see the module docstring)."""
    return tiny_pi05(work / "pi05")


def test_lerobot_061_pi05_actions_are_joynexus_actions(checkpoint: Path, work: Path) -> None:
    """In: for the same observation and noise, JoyNexus's π0.5 (the shared prefix with
    the state written into each row's prompt, a tenant's copy of the expert) predicts
    lerobot 0.6.1's ``select_action`` actions, processors included."""
    answer = lerobot_pi_answer(checkpoint, work, TASKS, side=SIDE)
    base = ResidentBaseModel.from_pretrained(str(checkpoint))
    assert isinstance(base.resident, LeRobotPiPrefix) and base.arch == PI05_ARCH
    schema = pi_schema()
    slot = TenantSlot("t", schema, base, Pi05ExpertConfig(), optimizer=OptimizerConfig(lr=1e-3))
    slot.normalization = base.default_normalization(schema)
    assert slot.normalization is not None and slot.normalization.mode == "quantile"
    assert isinstance(slot.action_module, Pi05Expert)
    mine = joynexus_pi_answer(base, slot, answer, TASKS)
    # The prompts carry each row's state, tokenized as lerobot's processor did.
    assert torch.equal(mine.input_ids, answer.tokens)
    theirs = answer.actions
    assert theirs.shape == mine.actions.shape == (2, 4, 6)
    difference = (mine.actions - theirs).abs().max().item()
    print(f"largest action difference, JoyNexus vs lerobot 0.6.1 pi05: {difference:.3g}")
    assert difference <= TOLERANCE
    # Not vacuous: the rows (different observations) act differently.
    assert (theirs[0] - theirs[1]).abs().max() > 1e-3


def test_a_schema_wider_than_the_pi05_checkpoint_is_a_spec_error(checkpoint: Path) -> None:
    base = ResidentBaseModel.from_pretrained(str(checkpoint))
    config = Pi05ExpertConfig()
    with pytest.raises(SpecError, match="max_action_dim of 8"):
        config.check_base(base, pi_schema(action_dim=9))
