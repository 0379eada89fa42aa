"""What every export of a tenant's pretrained-checkpoint expert reads: the tenant
checkpoint's expert tensors and the normalization it trained with."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from joynexus.errors import InvalidRequestError
from joynexus.models.checkpoints.payload import (
    ACTION_MODULE_FILE,
    NORMALIZATION_FILE,
    read_manifest,
)
from joynexus.models.normalization import NormalizationStats
from joynexus.models.tenant.slots import ACTION_MODULE_PREFIX


def read_tenant_expert(
    checkpoint: str | Path, head_type: str, what: str
) -> tuple[dict[str, torch.Tensor], NormalizationStats | None]:
    """The action module's tensors (by the module's own names) of the tenant checkpoint
    ``checkpoint`` (``outputs/<tenant>/step_<n>``), and its normalization if it has one.

    Raises:
        NotFoundError: no checkpoint there.
        InvalidRequestError: the checkpoint holds another action module than
            ``head_type`` (``what`` names the export format).
    """
    root = Path(checkpoint)
    manifest = read_manifest(root)
    found = manifest.head.get("type")
    if found != head_type:
        raise InvalidRequestError(
            f"{root}: the checkpoint holds a {found!r} action module; only a "
            f"{head_type!r} exports as {what}",
            field="checkpoint",
        )
    tensors = load_file(str(root / ACTION_MODULE_FILE))
    expert = {
        k.removeprefix(ACTION_MODULE_PREFIX): v
        for k, v in tensors.items()
        if k.startswith(ACTION_MODULE_PREFIX)
    }
    stats = None
    if NORMALIZATION_FILE in manifest.files:
        stats = NormalizationStats.model_validate_json((root / NORMALIZATION_FILE).read_text())
    return expert, stats
