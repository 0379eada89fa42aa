"""Tiny π0 / π0.5 checkpoints saved by lerobot 0.6.1 itself, in the reference environment.

How they are shrunk is the side script's docstring (``joynexus/interop/side/
lerobot_pi.py``): lerobot's own ``PI0Config`` / ``PI05Config`` with the ``gemma_300m``
variants, made small inside the reference process after the config is constructed. The
tests, ``joynexus models make-tiny --family pi0|pi05`` and ``joynexus bench
group-batching --arch pi05`` build theirs here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from joynexus.interop.reference import run_reference

#: The tiny checkpoint's cameras (32 px each).
TINY_PI_CAMERAS = ("top", "wrist")
#: The LeRobot families built here (lerobot's ``type``).
TINY_PI_FAMILIES = ("pi0", "pi05")
#: ``tiny``: shrunk inside the reference process; ``real``: lerobot's unmodified
#: ``gemma_300m`` variants (about 1.9 B parameters, 7.8 GB in fp32), 224 px cameras.
PI_SIZES = ("tiny", "real")


def make_tiny_pi(
    family: str,
    out: Path,
    *,
    seed: int = 3,
    cameras: Sequence[str] = TINY_PI_CAMERAS,
    size: str = "tiny",
    timeout: float = 900.0,
) -> Path:
    """A tiny π0 or π0.5 (``family``; ``cameras`` at 32 px, state and action 6 padded to
    8, chunk 4, 3 denoising steps) written by lerobot 0.6.1 into ``out``; ``size``
    ``real``: lerobot's unmodified ``gemma_300m`` policy at its default settings
    (cameras at 224 px, padded to 32, chunk 50, 10 steps), random weights.

    Raises:
        ValueError: ``family`` is not one of :data:`TINY_PI_FAMILIES`, or ``size`` not
            one of :data:`PI_SIZES`.
        ServiceUnavailableError: the reference environment is not built or cannot be
            entered here (the message says how to build it).
        InvalidRequestError: lerobot failed.
    """
    if family not in TINY_PI_FAMILIES:
        raise ValueError(f"family {family!r} is not one of {list(TINY_PI_FAMILIES)}")
    if size not in PI_SIZES:
        raise ValueError(f"size {size!r} is not one of {list(PI_SIZES)}")
    out = Path(out).absolute()
    args = ["make-tiny", "--family", family, "--out", str(out), "--seed", str(seed)]
    args += ["--size", size]
    for camera in cameras:
        args += ["--camera", camera]
    out.parent.mkdir(parents=True, exist_ok=True)
    run_reference("lerobot_pi.py", args, binds=[out.parent], timeout=timeout)
    return out


def make_tiny_pi05(out: Path, *, seed: int = 3, cameras: Sequence[str] = TINY_PI_CAMERAS) -> Path:
    """:func:`make_tiny_pi` of π0.5."""
    return make_tiny_pi("pi05", out, seed=seed, cameras=cameras)


def make_tiny_pi0(out: Path, *, seed: int = 3, cameras: Sequence[str] = TINY_PI_CAMERAS) -> Path:
    """:func:`make_tiny_pi` of π0."""
    return make_tiny_pi("pi0", out, seed=seed, cameras=cameras)
