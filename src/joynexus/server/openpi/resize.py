"""Fit a robot's camera image to a tenant's input size without distorting it.

openpi's robots send images at the size their own client code chose (LIBERO's example
sends 224×224), while a tenant's schema fixes another. openpi's input transforms
bridge that by "resize with pad": scale the image so that it fits inside the target
while keeping its aspect ratio, then centre it on a black canvas of the target size
(the odd pixel of padding going to the bottom / right). :func:`resize_with_pad` does
the same for one H×W×C image, so a policy served here sees what openpi's own
pipeline would have shown it.

Pillow (a dependency already, and free of torch, which front processes must not
load) does the resampling, as in openpi's client-side helper: bilinear, which Pillow
widens into an area filter when shrinking, so a 224 px frame brought down to 32 px is
averaged rather than aliased. A float image is brought to uint8 first (what the
schema holds), so both dtypes take the same path.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

__all__ = ["fitted_size", "resize_with_pad", "to_uint8"]


def fitted_size(height: int, width: int, target_h: int, target_w: int) -> tuple[int, int]:
    """(h, w) of an image of ``height``×``width`` scaled to fit ``target_h``×``target_w``
    with its aspect ratio kept: the limiting side fills the target exactly, the other is
    rounded down (never below one pixel). Integer arithmetic, so 256→224 is exact."""
    if width * target_h >= height * target_w:  # the width limits
        return max(1, height * target_w // width), target_w
    return target_h, max(1, width * target_h // height)


def to_uint8(image: np.ndarray) -> np.ndarray:
    """uint8 pixels of ``image``: uint8 as is; float read as [0, 1] (NaN as 0, clipped).

    Raises:
        ValueError: ``image`` is neither uint8 nor float.
    """
    if image.dtype == np.uint8:
        return image
    if image.dtype.kind != "f":
        raise ValueError(f"expected uint8 or float pixels, got dtype {image.dtype}")
    scaled = np.clip(np.nan_to_num(image.astype(np.float32)), 0.0, 1.0) * np.float32(255.0)
    return np.round(scaled).astype(np.uint8)


def resize_with_pad(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``image`` (H×W×C, uint8, or float in [0, 1]) as uint8 ``height``×``width``×C.

    The image is scaled (bilinear) to fit with its aspect ratio kept and centred on a
    zero (black) canvas; the padding's odd pixel goes to the bottom / right. An image
    already of the target size is only converted to uint8.

    Raises:
        ValueError: ``image`` is not H×W×C of a positive size, or neither uint8 nor float.
    """
    if image.ndim != 3 or image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"expected an H×W×C image, got shape {list(image.shape)}")
    pixels = np.ascontiguousarray(to_uint8(image))
    h, w, channels = pixels.shape
    if (h, w) == (height, width):
        return pixels
    fit_h, fit_w = fitted_size(h, w, height, width)
    top, left = (height - fit_h) // 2, (width - fit_w) // 2
    out = np.zeros((height, width, channels), dtype=np.uint8)
    # RGB in one call; any other channel count band by band ("L"), since Pillow would
    # premultiply a 4th channel as alpha (an RGBD camera's depth is no alpha).
    bands = [pixels] if channels == 3 else [pixels[:, :, c] for c in range(channels)]
    for c, band in enumerate(bands):
        im = Image.fromarray(np.ascontiguousarray(band))
        scaled = np.asarray(im.resize((fit_w, fit_h), resample=Image.Resampling.BILINEAR))
        target = out[top : top + fit_h, left : left + fit_w]
        if channels == 3:
            target[...] = scaled
        else:
            target[:, :, c] = scaled
    return out
