from __future__ import annotations

import pytest

from joynexus.models.backbone import ResidentBaseModel
from tests.envs.fake_envs import ensure_registered

# Session-wide tiny backbones of the model-layer tests, reused by the model services' tests.
from tests.models.conftest import TinyBackbone, tiny_backbone, tiny_model_dir  # noqa: F401

ensure_registered()


@pytest.fixture
def base(tiny_backbone: TinyBackbone) -> ResidentBaseModel:  # noqa: F811
    """The session's tiny Qwen2.5-VL backbone, the base the service tests build on."""
    return tiny_backbone("qwen2_5_vl")
