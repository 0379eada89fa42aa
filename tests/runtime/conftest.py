from __future__ import annotations

from pathlib import Path

import pytest

from joynexus.models.tiny import make_tiny


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen2.5-VL saved once per session; specs name it by path like a hub id."""
    return str(make_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "qwen"))


@pytest.fixture(scope="session")
def reach2d_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.workflows.helpers import record_reach2d_demos

    return record_reach2d_demos(tmp_path_factory.mktemp("demos") / "reach2d", episodes=20)
