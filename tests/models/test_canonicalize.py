"""Canonicalization shares work across a batch without changing any row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from joynexus.models.batch import ObservationBatch
from joynexus.models.canon import canonicalize as canon
from joynexus.models.schema import CameraSpec, DataSchema
from tests.models.conftest import TinyBackbone


def _schema(name: str, h: int, w: int, cams: int = 1) -> DataSchema:
    return DataSchema(
        name=name,
        cameras={f"c{i}": CameraSpec(height=h, width=w) for i in range(cams)},
        state_dim=3,
        action_dim=2,
        action_chunk=2,
        instruction=f"task of {name}",
    )


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "paligemma"])
def test_a_mixed_batch_equals_each_group_alone(tiny_backbone: TinyBackbone, arch: str) -> None:
    """Cameras resized together across tenants (same source shape) and cached prompts
    give every row exactly what canonicalizing its group alone gives."""
    base = tiny_backbone(arch)
    a, b, c = _schema("a", 32, 32), _schema("b", 24, 40), _schema("c", 32, 32)
    groups = [
        ("a", a, ObservationBatch.synthetic(a, 2, seed=1, with_actions=False)),
        ("b", b, ObservationBatch.synthetic(b, 1, seed=2, with_actions=False)),
        ("c", c, ObservationBatch.synthetic(c, 3, seed=3, with_actions=False)),
    ]
    mixed = base.canonicalize(groups)
    for tid, schema, batch in groups:
        alone = base.canonicalize([(tid, schema, batch)])
        entry = mixed.slice_of(tid)
        rows = slice(entry.start, entry.stop)
        for key in ("pixel_values",):
            if key in alone.model_inputs and alone.model_inputs[key].shape[0] == batch.batch_size:
                torch.testing.assert_close(mixed.model_inputs[key][rows], alone.model_inputs[key])
        torch.testing.assert_close(mixed.camera_mask[rows], alone.camera_mask)
        # Left padding: a row's real tokens are its last ones, the same as alone.
        n = int(alone.model_inputs["attention_mask"].shape[1])
        torch.testing.assert_close(
            mixed.model_inputs["input_ids"][rows, -n:], alone.model_inputs["input_ids"]
        )


def test_the_batched_resize_is_the_per_image_resize() -> None:
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, size=(5, 24, 40, 3), dtype=np.uint8)
    together = canon.resize_with_pad(imgs, 32)
    for i in range(5):
        assert torch.equal(together[i : i + 1], canon.resize_with_pad(imgs[i : i + 1], 32))


@pytest.mark.parametrize("src", [(32, 32), (480, 640), (17, 31), (112, 90)])
def test_the_direct_resize_op_is_f_interpolates_antialiased_bilinear(src: tuple[int, int]) -> None:
    # resize_with_pad calls the aten op behind F.interpolate(antialias=True) directly;
    # both must give the same bytes, up- and downscaling, on the channels-last layout.
    h, w = src
    imgs = np.random.default_rng(2).integers(0, 256, size=(2, h, w, 3), dtype=np.uint8)
    x = torch.from_numpy(imgs.transpose(0, 3, 1, 2))
    for size in [(56, 56), (37, 61)]:
        assert torch.equal(canon._resize_aa(x, size), canon._interpolate_aa(x, size))
    assert canon._resize_aa is canon._aten_aa  # this torch has the op


def test_prompts_are_rendered_once_per_instruction(
    tiny_backbone: TinyBackbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tiny_backbone("qwen2_5_vl")
    rendered: list[str] = []
    real = canon._prompt

    def counting(processor: object, spec: canon.CanonicalSpec, instruction: str) -> str:
        rendered.append(instruction)
        return real(processor, spec, instruction)

    monkeypatch.setattr(canon, "_prompt", counting)
    schema = _schema("p", 32, 32)
    batch = ObservationBatch.synthetic(schema, 4, seed=0, with_actions=False)
    unique = f"a never seen instruction {id(rendered)}"
    batch = ObservationBatch(
        cameras=batch.cameras, state=batch.state, instructions=[unique] * 4, actions=None
    )
    first = base.canonicalize([("p", schema, batch)])
    second = base.canonicalize([("p", schema, batch)])
    assert rendered == [unique]  # once, for 8 rows over two calls
    assert torch.equal(first.model_inputs["input_ids"], second.model_inputs["input_ids"])
    other = ObservationBatch(
        cameras=batch.cameras, state=batch.state, instructions=["another task"] * 4, actions=None
    )
    third = base.canonicalize([("p", schema, other)])
    assert not torch.equal(first.model_inputs["input_ids"], third.model_inputs["input_ids"])


@pytest.mark.parametrize(
    "shape", [(3, 24, 40, 3), (2, 480, 640, 3), (2, 17, 31, 1), (2, 50, 64, 4)]
)
def test_the_resize_is_within_one_level_of_the_float_resize(shape: tuple[int, ...]) -> None:
    # The canonical resize runs torch's uint8 kernel; the same resize done in floats and
    # rounded is the reference it must stay within one intensity level of.
    imgs = np.random.default_rng(1).integers(0, 256, size=shape, dtype=np.uint8)
    size = 56
    got = canon.resize_with_pad(imgs, size)
    x = torch.from_numpy(imgs).permute(0, 3, 1, 2)
    x = x[:, :1].expand(-1, 3, -1, -1) if shape[-1] < 3 else x[:, :3]
    h, w = shape[1:3]
    new_h, new_w = round(h * size / max(h, w)), round(w * size / max(h, w))
    ref = F.interpolate(
        x.float(), size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True
    )
    top, left = (size - new_h) // 2, (size - new_w) // 2
    inner = got[:, :, top : top + new_h, left : left + new_w].int()
    assert int((inner - ref.round().int()).abs().max()) <= 1
    assert got.shape == (shape[0], 3, size, size) and got.is_contiguous()
