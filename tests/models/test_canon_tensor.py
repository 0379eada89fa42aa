"""The tensor canonicalizer equals the Hugging Face processor, architecture by architecture."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from joynexus.errors import InvalidRequestError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon import tensor as canon_tensor
from joynexus.models.canon.feature import VLAFeature
from joynexus.models.canon.tensor import EQUAL_ATOL, TensorCanonicalizer, max_abs_difference
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.models.tiny import ARCHES
from tests.models.conftest import TinyBackbone

_LONG = "pick up the red block and put it in the bowl, then close the drawer " * 12


def _schema(name: str, shapes: list[tuple[int, int]], state_dim: int = 3) -> DataSchema:
    return DataSchema(
        name=name,
        cameras={f"c{i}": CameraSpec(height=h, width=w) for i, (h, w) in enumerate(shapes)},
        state_dim=state_dim,
        action_dim=2,
        action_chunk=2,
    )


def _batch(schema: DataSchema, instructions: list[str], seed: int) -> ObservationBatch:
    b = ObservationBatch.synthetic(schema, len(instructions), seed=seed, with_actions=False)
    return ObservationBatch(cameras=b.cameras, state=b.state, instructions=instructions)


@contextmanager
def _path(base: ResidentBaseModel, kind: str) -> Iterator[None]:
    """Switch the shared session backbone's path for a block, then back to tensor."""
    base.use_canonicalizer(kind)  # type: ignore[arg-type]
    try:
        yield
    finally:
        base.use_canonicalizer("tensor")


def _both(
    base: ResidentBaseModel, groups: list[tuple[str, DataSchema, ObservationBatch]]
) -> tuple[VLAFeature, VLAFeature]:
    assert base.canonicalizer == "tensor", base.canonicalizer_fallback
    tensor = base.canonicalize(groups)
    with _path(base, "processor"):
        reference = base.canonicalize(groups)
    return reference, tensor


def _assert_equal(reference: VLAFeature, tensor: VLAFeature) -> None:
    ref, got = reference.model_inputs, tensor.model_inputs
    assert sorted(ref) == sorted(got)
    for key, want in ref.items():
        have = got[key]
        assert have.shape == want.shape, key
        assert have.dtype == want.dtype, key
        assert have.device == want.device, key
        if want.is_floating_point():
            torch.testing.assert_close(have, want, atol=EQUAL_ATOL, rtol=0)
        else:
            assert torch.equal(have, want), key
    assert max_abs_difference(ref, got) <= EQUAL_ATOL
    assert torch.equal(reference.camera_mask, tensor.camera_mask)
    assert torch.equal(reference.state, tensor.state)
    assert reference.slices == tensor.slices


@pytest.mark.parametrize("arch", ARCHES)
def test_odd_sizes_several_cameras_empty_and_long_prompts(
    tiny_backbone: TinyBackbone, arch: str
) -> None:
    base = tiny_backbone(arch)
    one = _schema("one", [(23, 41)])
    two = _schema("two", [(31, 17), (9, 57)], state_dim=5)
    groups = [
        ("a", one, _batch(one, ["", _LONG, "x"], seed=1)),
        ("b", two, _batch(two, ["open the top drawer of the cabinet", ""], seed=2)),
    ]
    reference, tensor = _both(base, groups)
    _assert_equal(reference, tensor)
    # The rows differ in prompt length, so left padding was exercised.
    mask = tensor.model_inputs["attention_mask"]
    assert int(mask.sum(dim=1).min()) < int(mask.shape[1])


@pytest.mark.parametrize("arch", ARCHES)
def test_one_tenant_one_row_equals_the_processor(tiny_backbone: TinyBackbone, arch: str) -> None:
    base = tiny_backbone(arch)
    schema = _schema("s", [(64, 64)])
    reference, tensor = _both(base, [("s", schema, _batch(schema, ["reach the target"], seed=3))])
    _assert_equal(reference, tensor)


def test_a_one_row_batch_reuses_its_cached_prompt_and_grid_unchanged_by_a_forward(
    tiny_backbone: TinyBackbone,
) -> None:
    """A lone request's prompt tensors and image grid are built once, not per request;
    the forward only reads them, so the next request still equals the processor."""
    base = tiny_backbone("qwen2_5_vl")
    schema = _schema("r", [(32, 32)])
    first = base.canonicalize([("r", schema, _batch(schema, ["stack the cups"], seed=6))])
    with torch.no_grad():
        base.encode(first)
    reference, second = _both(base, [("r", schema, _batch(schema, ["stack the cups"], seed=7))])
    _assert_equal(reference, second)
    for key in ("input_ids", "attention_mask", "image_grid_thw"):
        assert second.model_inputs[key] is first.model_inputs[key], key


def test_pi0_rows_without_a_full_camera_set(tiny_backbone: TinyBackbone) -> None:
    """π0 shows each row only its present cameras: a batch where no row fills every
    slot has fewer image columns than slots, exactly as the processor pads it."""
    base = tiny_backbone("pi0")
    assert base.num_camera_slots >= 2
    one = _schema("one", [(20, 30)])
    reference, tensor = _both(base, [("a", one, _batch(one, ["a", "bb"], seed=4))])
    _assert_equal(reference, tensor)
    assert tensor.model_inputs["pixel_values"].shape[1] == 1


def test_prompt_ids_come_from_the_cache(
    tiny_backbone: TinyBackbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tiny_backbone("qwen2_5_vl")
    schema = _schema("p", [(32, 32)])
    unique = f"an instruction never seen before {id(monkeypatch)}"
    batch = _batch(schema, [unique] * 3, seed=5)
    calls: list[int] = []
    real = canon_tensor.processor_inputs

    def counting(*args: object, **kwargs: object) -> dict[str, torch.Tensor]:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(canon_tensor, "processor_inputs", counting)
    first = base.canonicalize([("p", schema, batch)])
    second = base.canonicalize([("p", schema, batch)])
    assert len(calls) == 1  # one processor call for six rows over two batches
    assert torch.equal(first.model_inputs["input_ids"], second.model_inputs["input_ids"])


def test_the_tensor_path_is_the_default_and_the_processor_selectable(
    tiny_model_dir: object,
) -> None:
    path = tiny_model_dir("paligemma")  # type: ignore[operator]
    base = ResidentBaseModel.from_pretrained(str(path))
    assert base.canonicalizer == "tensor"
    assert base.canonicalizer_fallback is None
    ref = ResidentBaseModel.from_pretrained(str(path), canonicalizer="processor")
    assert ref.canonicalizer == "processor"
    with pytest.raises(InvalidRequestError, match="canonicalizer"):
        base.use_canonicalizer("pil")  # type: ignore[arg-type]


def test_a_processor_it_does_not_reproduce_keeps_the_processor_path(
    tiny_backbone: TinyBackbone,
) -> None:
    """A processor that resizes the canonical square (here: to another side) is not
    what the tensor layout computes; the load-time check says so instead of serving
    different inputs."""
    base = tiny_backbone("paligemma")
    processor = copy.deepcopy(base.processor)
    side = base.canonical_image_size + 14
    processor.image_processor.size = {"height": side, "width": side}
    tensor, why = TensorCanonicalizer.build(processor, base._spec)
    assert tensor is None
    assert why is not None and "pixel_values" in why


def test_images_of_a_group_are_laid_out_in_one_call(tiny_backbone: TinyBackbone) -> None:
    """Every camera of every row goes through one rescale-and-normalize: rows laid out
    together equal rows laid out one by one."""
    base = tiny_backbone("qwen2_5_vl")
    tensor, why = TensorCanonicalizer.build(base.processor, base._spec)
    assert tensor is not None, why
    size, slots = base.canonical_image_size, base.num_camera_slots
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (3, slots, 3, size, size), dtype=np.uint8))
    mask = torch.ones((3, slots), dtype=torch.bool)
    together = tensor.pixels(images, mask)["pixel_values"]
    alone = torch.cat(
        [tensor.pixels(images[i : i + 1], mask[i : i + 1])["pixel_values"] for i in range(3)]
    )
    assert torch.equal(together, alone)
