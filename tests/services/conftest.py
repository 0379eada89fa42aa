from __future__ import annotations

from tests.envs.fake_envs import ensure_registered

ensure_registered()
