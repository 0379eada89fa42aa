"""Tiny π0 / π0.5 checkpoints saved by lerobot 0.6.1 itself, in the reference environment.

How they are shrunk is the side script's docstring (``joynexus/interop/side/
lerobot_pi.py``): lerobot's own ``PI05Config`` with the ``gemma_300m`` variants, made
small inside the reference process after the config is constructed. Tests that use one
FAIL (never skip) when the reference environment is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from joynexus.interop.reference import reference_problem, run_reference

CAMERAS = ("top", "wrist")


def require_reference() -> None:
    """The reference environment must run; the test FAILS (never skips) when not."""
    problem = reference_problem()
    if problem is not None:
        pytest.fail(problem)


def tiny_pi05(out: Path, *, seed: int = 3) -> Path:
    """A tiny π0.5 (cameras ``top`` and ``wrist`` at 32 px, state and action 6 padded
    to 8, chunk 4, 3 denoising steps) written by lerobot 0.6.1 into ``out``."""
    require_reference()
    args = ["make-tiny", "--family", "pi05", "--out", str(out), "--seed", str(seed)]
    for camera in CAMERAS:
        args += ["--camera", camera]
    out.parent.mkdir(parents=True, exist_ok=True)
    run_reference("lerobot_pi.py", args, binds=[out.parent])
    return out
