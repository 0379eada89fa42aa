"""Tiny π0 / π0.5 checkpoints saved by lerobot 0.6.1 itself, in the reference environment.

How they are shrunk is the side script's docstring (``joynexus/interop/side/
lerobot_pi.py``): lerobot's own ``PI05Config`` with the ``gemma_300m`` variants, made
small inside the reference process after the config is constructed. Tests that use one
FAIL (never skip) when the reference environment is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from joynexus.interop.reference import reference_problem
from joynexus.interop.tiny_pi import TINY_PI_CAMERAS, make_tiny_pi05

CAMERAS = TINY_PI_CAMERAS


def require_reference() -> None:
    """The reference environment must run; the test FAILS (never skips) when not."""
    problem = reference_problem()
    if problem is not None:
        pytest.fail(problem)


def tiny_pi05(out: Path, *, seed: int = 3) -> Path:
    """A tiny π0.5 (cameras ``top`` and ``wrist`` at 32 px, state and action 6 padded
    to 8, chunk 4, 3 denoising steps) written by lerobot 0.6.1 into ``out``."""
    require_reference()
    return make_tiny_pi05(out, seed=seed, cameras=CAMERAS)
