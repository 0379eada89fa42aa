"""Session-wide tiny backbones, built offline once per architecture.

Fixtures for any model-layer test:

* ``tiny_model_dir(arch, size="tiny") -> Path``: a directory holding a saved, randomly
  initialised model of the real architecture (``make_tiny``), built once per session.
* ``tiny_backbone(arch) -> ResidentBaseModel``: that directory loaded through
  ``ResidentBaseModel.from_pretrained`` (fp32, CPU), loaded once per session. It is frozen,
  so sharing one instance between tests is safe.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.tiny import make_tiny

TinyModelDir = Callable[..., Path]
TinyBackbone = Callable[[str], ResidentBaseModel]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> TinyModelDir:
    built: dict[tuple[str, str], Path] = {}

    def get(arch: str, size: str = "tiny") -> Path:
        key = (arch, size)
        if key not in built:
            out = tmp_path_factory.mktemp(f"{arch}-{size}")
            built[key] = make_tiny(arch, out, size=size, seed=0)
        return built[key]

    return get


@pytest.fixture(scope="session")
def tiny_backbone(tiny_model_dir: TinyModelDir) -> TinyBackbone:
    loaded: dict[str, ResidentBaseModel] = {}

    def get(arch: str) -> ResidentBaseModel:
        if arch not in loaded:
            loaded[arch] = ResidentBaseModel.from_pretrained(str(tiny_model_dir(arch)))
        return loaded[arch]

    return get
