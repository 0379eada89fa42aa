"""A resident architecture added by its folder alone (tests): a *packaged* PaliGemma.

A packaged checkpoint is a ``transformers`` PaliGemma directory with a ``package.json``
marker, a pretrained head (``head.safetensors``) and the statistics it was trained with
(``stats.json``). The architecture claims such a directory (before any ``transformers``
model type is looked at), loads the PaliGemma as the frozen backbone, and hands its
policy family (:mod:`tests.models.plugin_family`) the :class:`PackagedHead` extension;
a tenant without statistics of its own takes the package's. Nothing in
``joynexus.models.backbone`` or ``joynexus.services`` names it: registering it is one
:func:`~joynexus.models.archs.registry.register_arch` call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from joynexus.models.archs.base import (
    LoadRequest,
    Resident,
    ResidentArch,
    fitting_statistics,
    read_sidecar,
)
from joynexus.models.archs.hf import hf
from joynexus.models.normalization import NormalizationStats
from joynexus.models.schema import DataSchema

MARKER = "package.json"
HEAD_FILE = "head.safetensors"
STATS_FILE = "stats.json"


@dataclass(frozen=True)
class PackagedHead:
    """The package's pretrained head and its training statistics."""

    state: dict[str, torch.Tensor]
    normalization: NormalizationStats


class PackagedResident(Resident):
    def default_normalization(self, schema: DataSchema) -> NormalizationStats | None:
        assert isinstance(self.extension, PackagedHead)
        return fitting_statistics(self.extension.normalization, schema)


class PackagedPaliGemma(ResidentArch):
    name = "packaged_paligemma"
    resident = PackagedResident

    def claims(self, model_id: str, *, local_only: bool) -> str | None:
        path = Path(model_id)
        return str(path) if (path / MARKER).is_file() else None

    def load_model(self, request: LoadRequest) -> tuple[torch.nn.Module, object | None]:
        model, _ = super().load_model(request)
        root = Path(request.path)
        stats = NormalizationStats.model_validate_json((root / STATS_FILE).read_text())
        return model, PackagedHead(load_file(str(root / HEAD_FILE)), stats)

    def load(self, request: LoadRequest) -> Resident:
        # A claimed directory comes without its config; this format has one inside.
        config = hf().AutoConfig.from_pretrained(request.path, local_files_only=True)
        return super().load(replace(request, config=config, sidecar=read_sidecar(request.path)))


def package(model_dir: Path, head: dict[str, torch.Tensor], stats: NormalizationStats) -> None:
    """Turn a saved PaliGemma directory into a package of ``head`` and ``stats``."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in head.items()}, str(model_dir / HEAD_FILE))
    (model_dir / STATS_FILE).write_text(stats.model_dump_json())
    (model_dir / MARKER).write_text(json.dumps({"format": "packaged_paligemma"}))


ARCH = PackagedPaliGemma()
