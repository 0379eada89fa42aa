"""A π0 tenant's checkpoint → a complete ``PI0ForConditionalGeneration`` directory.

``joynexus models export-pi0`` reads one tenant checkpoint (``outputs/<tenant>/step_<n>``)
of a ``pi0_expert`` action module, puts its expert back next to the resident PaliGemma
prefix (:func:`export_pi0`) and writes a directory that plain
``transformers`` loads with ``from_pretrained``. The tenant computes in normalized units;
with ``mean_std`` normalization the processor carries the tenant's statistics
(``state_mean``/``state_std``/``actions_mean``/``actions_std``) so ``processor(state=...)``
normalizes the state as the service does, and actions come out normalized (multiply by
``actions_std``, add ``actions_mean``).
"""

from __future__ import annotations

import copy
import importlib
from pathlib import Path
from typing import Any

import torch

from joynexus.errors import InvalidRequestError, SpecError
from joynexus.models.archs.hf import quiet_transformers
from joynexus.models.archs.lerobot_pi.checkpoint import Pi0LeRobotCheckpoint
from joynexus.models.archs.paligemma.pi0 import EXPERT_EMBED_KEY, VLM_PREFIX, Pi0Checkpoint
from joynexus.models.checkpoints.tenant_export import read_tenant_expert
from joynexus.models.policies.pi0_expert.config import pi0_checkpoint_of
from joynexus.models.types import extension_of


def export_pi0_checkpoint(checkpoint: str | Path, out: str | Path, *, base: Any) -> Path:
    """Export the ``pi0_expert`` tenant checkpoint ``checkpoint`` into ``out``.

    Args:
        checkpoint: A tenant checkpoint directory (with ``manifest.json``).
        out: Directory to write.
        base: The resident π0 base model the tenant trained on.

    Raises:
        NotFoundError: no checkpoint there.
        InvalidRequestError: the checkpoint is not of a ``pi0_expert`` action module.
        SpecError: ``base`` is not a π0 base model.
    """
    expert, stats = read_tenant_expert(checkpoint, "pi0_expert", "a π0 policy")
    if extension_of(base, Pi0LeRobotCheckpoint) is not None:
        raise SpecError(
            "export --format pi0 writes transformers' PI0ForConditionalGeneration; this "
            "tenant's base model is a LeRobot π0 policy: export it with --format lerobot",
            field="format",
        )
    pi0 = pi0_checkpoint_of(base, what="export-pi0")
    processor = copy.deepcopy(base.processor)
    if stats is not None and stats.mode == "mean_std":
        # The scales the tenant trained with (floored: a constant dimension's std of
        # 0 would divide by zero in the exported processor).
        center, scale = stats.center_scale("action")
        processor.actions_mean, processor.actions_std = center.tolist(), scale.tolist()
        if stats.state is not None:
            center, scale = stats.center_scale("state")
            processor.state_mean, processor.state_std = center.tolist(), scale.tolist()
    return export_pi0(pi0, processor, expert, out)


def export_pi0(
    pi0: Pi0Checkpoint,
    processor: Any,
    expert_state: dict[str, torch.Tensor],
    out_dir: str | Path,
) -> Path:
    """Write a complete ``PI0ForConditionalGeneration`` directory: the resident prefix
    plus one tenant's expert, loadable with plain ``transformers``' ``from_pretrained``.

    Args:
        pi0: The resident checkpoint (config, VLM, pretrained expert embedding).
        processor: The resident processor (saved alongside).
        expert_state: The tenant expert's tensors by checkpoint name
            (``model.dit.*``, ``embed_action_time.*``, ``action_out_proj.*``).
        out_dir: Directory to write (created if missing).

    Raises:
        InvalidRequestError: ``expert_state`` does not name exactly the expert's tensors.
    """
    hf = importlib.import_module("transformers")
    state: dict[str, torch.Tensor] = {VLM_PREFIX + k: v for k, v in pi0.vlm.state_dict().items()}
    state[EXPERT_EMBED_KEY] = pi0.expert_state[EXPERT_EMBED_KEY]
    state.update(expert_state)
    with torch.device("meta"):
        policy = hf.PI0ForConditionalGeneration(pi0.config)
    wanted = set(policy.state_dict())
    if set(state) != wanted:
        missing, extra = sorted(wanted - set(state)), sorted(set(state) - wanted)
        raise InvalidRequestError(
            f"export: the expert does not match the π0 checkpoint (missing {missing[:5]}, "
            f"unexpected {extra[:5]})",
            missing=missing[:20],
            unexpected=extra[:20],
        )
    # Built on the meta device and filled by assignment: no second copy of the VLM is
    # ever initialised. Only the state dict is written; non-persistent buffers (rotary
    # and sinusoid frequencies) are recomputed by whoever loads the directory.
    policy.load_state_dict(
        {k: v.detach().to("cpu") for k, v in state.items()}, strict=True, assign=True
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        policy.save_pretrained(out)
        processor.save_pretrained(out)
    return out
