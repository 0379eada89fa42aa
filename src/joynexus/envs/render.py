"""Rendering helpers shared by adapters: image resizing and MuJoCo fast rendering."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from PIL import Image

__all__ = ["ensure_headless_gl", "mujoco_fast_render", "mujoco_render_rgb", "resize_image"]


def ensure_headless_gl() -> None:
    """Pick EGL for MuJoCo unless the user chose a backend (must run before mujoco loads GL)."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])


def resize_image(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize an ``[H, W, C]`` uint8 image (bilinear); a no-op when it already fits."""
    if image.shape[0] == height and image.shape[1] == width:
        return np.ascontiguousarray(image, dtype=np.uint8)
    pil = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
    return np.asarray(pil.resize((width, height), Image.Resampling.BILINEAR), dtype=np.uint8)


def mujoco_fast_render(model: Any) -> None:
    """Turn off multisampling before the offscreen context exists.

    MuJoCo reads ``vis.quality.offsamples`` when it creates the offscreen framebuffer, so
    this must run before the first render. Software rendering spends most of a frame
    on the shadow map, MSAA and reflections; the scene flags are turned off per viewer
    in :func:`mujoco_render_rgb`.
    """
    model.vis.quality.offsamples = 0


def mujoco_render_rgb(env: Any, *, fast: bool) -> np.ndarray:
    """Render a gymnasium MuJoCo env's ``rgb_array`` frame, robustly.

    Gymnasium's offscreen viewer never makes its own GL context current before
    rendering; with several envs in one process (a vectorized session), or after
    another env was closed (EGL then releases the thread's context), frames would come
    from the wrong context or be black. Making the context current every frame is cheap.
    """
    import mujoco

    renderer = env.unwrapped.mujoco_renderer
    viewer = renderer._get_viewer("rgb_array")
    viewer.make_context_current()
    if fast:
        viewer.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        viewer.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
    frame = env.unwrapped.render()
    return np.ascontiguousarray(frame, dtype=np.uint8)
