from __future__ import annotations

from tests.envs.fake_envs import ensure_registered

ensure_registered()

# Session-wide tiny backbones of the model-layer tests, for the service-wiring tests.
from tests.models.conftest import tiny_backbone, tiny_model_dir  # noqa: E402, F401
from tests.services.conftest import base  # noqa: E402, F401
