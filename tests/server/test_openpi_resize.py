"""Images of another size than the tenant's camera: resized with padding, as openpi does.

The unit checks pin the geometry (aspect kept, black padding centred with the odd pixel
at the bottom / right, exact output shape) and the dtype handling; one check runs
openpi_client's own ``image_tools.resize_with_pad`` in the openpi client venv on the
same images and compares pixels.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from joynexus.errors import SchemaMismatchError
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.server.openpi.observations import ObservationAdapter
from joynexus.server.openpi.resize import fitted_size, resize_with_pad
from joynexus.spec.serving import OpenPIServing

COLOR = np.array([10, 200, 30], dtype=np.uint8)


def _flat(height: int, width: int) -> np.ndarray:
    return np.broadcast_to(COLOR, (height, width, 3)).copy()


def _content_box(img: np.ndarray) -> tuple[slice, slice]:
    """Rows and columns holding any non-black pixel."""
    rows = np.flatnonzero(img.any(axis=(1, 2)))
    cols = np.flatnonzero(img.any(axis=(0, 2)))
    return slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1)


def test_a_square_frame_shrinks_to_the_whole_target() -> None:
    out = resize_with_pad(_flat(224, 224), 32, 32)
    assert out.shape == (32, 32, 3) and out.dtype == np.uint8
    assert (out == COLOR).all()  # no padding: same aspect, and a flat colour stays flat


def test_aspect_is_kept_and_the_rest_is_black() -> None:
    # 64 tall x 32 wide into 32 x 32: 32 x 16 of content, 8 black columns each side.
    out = resize_with_pad(_flat(64, 32), 32, 32)
    rows, cols = _content_box(out)
    assert (rows.start, rows.stop, cols.start, cols.stop) == (0, 32, 8, 24)
    assert (out[rows, cols] == COLOR).all()
    assert not out[:, :8].any() and not out[:, 24:].any()

    # 224 x 300 into 64 x 64: 47 x 64 of content (224 * 64 // 300), 17 rows of padding:
    # 8 above, 9 below (openpi puts the odd one at the bottom).
    out = resize_with_pad(_flat(224, 300), 64, 64)
    rows, cols = _content_box(out)
    assert (rows.start, rows.stop, cols.start, cols.stop) == (8, 55, 0, 64)
    assert not out[:8].any() and not out[55:].any()


def test_upscaling_and_non_square_targets() -> None:
    out = resize_with_pad(_flat(16, 16), 24, 32)  # the height limits: 24 x 24, centred
    rows, cols = _content_box(out)
    assert out.shape == (24, 32, 3)
    assert (rows.start, rows.stop, cols.start, cols.stop) == (0, 24, 4, 28)
    assert fitted_size(256, 256, 224, 224) == (224, 224)  # exact, no float round-off
    assert fitted_size(1, 1000, 32, 32) == (1, 32)  # never a zero-pixel side


def test_content_is_scaled_not_cropped() -> None:
    # Left half white, right half black: after shrinking 2x the split is still centred.
    img = np.zeros((8, 16, 3), np.uint8)
    img[:, :8] = 255
    out = resize_with_pad(img, 4, 8)
    assert (out[:, :3] == 255).all() and (out[:, 5:] == 0).all()
    assert 0 < int(out[0, 3, 0]) <= 255 and int(out[0, 4, 0]) < 255  # blended at the edge


def test_float_images_read_as_zero_to_one() -> None:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)
    as_float = img.astype(np.float32) / 255.0
    a, b = resize_with_pad(img, 32, 32), resize_with_pad(as_float, 32, 32)
    assert b.dtype == np.uint8 and b.shape == (32, 32, 3)
    np.testing.assert_array_equal(a, b)  # quantized once, then the same path
    same = resize_with_pad(np.full((32, 32, 3), 2.0, np.float64), 32, 32)
    assert (same == 255).all()  # same size: only converted (and clipped)
    with pytest.raises(ValueError, match="expected uint8 or float pixels"):
        resize_with_pad(np.zeros((4, 4, 3), np.int16), 2, 2)


def test_a_fourth_channel_is_resized_as_data_not_as_alpha() -> None:
    # An RGB-D style camera: a zero 4th channel must not darken the colour (Pillow
    # premultiplies RGBA); each channel is resized on its own.
    img = np.zeros((64, 64, 4), np.uint8)
    img[..., :3] = COLOR
    img[..., 3] = np.arange(64, dtype=np.uint8)[None, :] * 4
    out = resize_with_pad(img, 16, 16)
    assert out.shape == (16, 16, 4) and (out[..., :3] == COLOR).all()
    assert (np.diff(out[0, :, 3].astype(int)) > 0).all()  # the ramp survives, shrunk


def _adapter(height: int = 32, width: int = 32, channels: int = 3) -> ObservationAdapter:
    schema = DataSchema(
        cameras={"image": CameraSpec(height=height, width=width, channels=channels)},
        state_dim=8,
        action_dim=7,
    )
    return ObservationAdapter(schema, OpenPIServing())


def _libero(image: np.ndarray) -> dict[str, object]:
    return {"observation/image": image, "observation/state": np.zeros(8), "prompt": "go"}


def test_the_adapter_resizes_what_it_can_and_says_what_to_fix_otherwise() -> None:
    adapter = _adapter()
    frame = np.random.default_rng(1).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    batch = adapter.batch(_libero(frame))
    assert batch.cameras["image"].shape == (1, 32, 32, 3)
    np.testing.assert_array_equal(batch.cameras["image"][0], resize_with_pad(frame, 32, 32))
    chw = adapter.batch(_libero(np.moveaxis(frame, -1, 0))).cameras["image"]
    np.testing.assert_array_equal(chw, batch.cameras["image"])  # C×H×W of another size too

    with pytest.raises(SchemaMismatchError, match=r"3 channel\(s\) expected.*to RGB") as exc:
        adapter.batch(_libero(np.zeros((224, 224, 4), np.uint8)))
    assert "observation/image: uint8 [32, 32, 3]" in str(exc.value)  # and what to send
    with pytest.raises(SchemaMismatchError, match=r"an image is H×W×3"):
        adapter.batch(_libero(np.zeros((224, 224), np.uint8)))
    with pytest.raises(SchemaMismatchError, match="the image is empty"):
        adapter.batch(_libero(np.zeros((0, 224, 3), np.uint8)))
    with pytest.raises(SchemaMismatchError, match="dtype int32, not uint8"):
        adapter.batch(_libero(np.zeros((224, 224, 3), np.int32)))
    gray = _adapter(channels=1).batch(_libero(np.full((64, 64), 7, np.uint8)))
    assert gray.cameras["image"].shape == (1, 32, 32, 1) and (gray.cameras["image"] == 7).all()


_OPENPI_RESIZE = """
import json, sys
import numpy as np
from openpi_client import image_tools
arrays = np.load(sys.argv[1])
targets = json.loads(sys.argv[2])
np.savez(sys.argv[3], **{k: image_tools.resize_with_pad(arrays[k], *targets[k]) for k in targets})
"""


def test_pixels_match_openpi_clients_resize_with_pad(tmp_path: Path) -> None:
    from tests.server.test_openpi import _client_python

    rng = np.random.default_rng(3)
    # Smooth content (a gradient plus a little noise): what a camera sees. Both sides
    # resample bilinearly with area widening, so pixels agree to within rounding.
    yy, xx = np.mgrid[0:224, 0:300]
    base = np.stack([yy, xx, yy + xx], axis=-1) % 256
    smooth = np.clip(base + rng.integers(-3, 4, base.shape), 0, 255).astype(np.uint8)
    cases = {
        "libero_to_32": (smooth[:, :224], (32, 32)),
        "wide_to_64": (smooth, (64, 64)),
        "up_to_48x40": (smooth[:20, :30], (48, 40)),
    }
    np.savez(tmp_path / "in.npz", **{k: img for k, (img, _) in cases.items()})
    targets = {k: list(t) for k, (_, t) in cases.items()}
    paths = [str(tmp_path / "in.npz"), json.dumps(targets), str(tmp_path / "out.npz")]
    run = subprocess.run(
        [_client_python(), "-c", _OPENPI_RESIZE, *paths],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = np.load(tmp_path / "out.npz")
    for name, (img, (h, w)) in cases.items():
        ours = resize_with_pad(img, h, w)
        assert ours.shape == theirs[name].shape, name
        # The padding is where openpi puts it, black
        assert ((ours == 0) == (theirs[name] == 0)).mean() > 0.99, name
        diff = np.abs(ours.astype(int) - theirs[name].astype(int))
        assert int(diff.max()) <= 1, (name, int(diff.max()))
