"""A Qwen-VL forward without repeated work: one pass for the blank slots of a forward,
the patch embedding as a matrix product, the tower's grid layout and the prompt rows'
rope positions computed once; each equal to the model's own path."""

from __future__ import annotations

import pytest
import torch

from joynexus.models.archs.base import Resident
from joynexus.models.archs.qwen_vl import QwenVLResident
from joynexus.models.archs.qwen_vl.vision_share import blank_plan
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.lora import LoRAConfig
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.schema import PUSHT, CameraSpec, DataSchema
from joynexus.models.tenant.slots import TenantSlot
from tests.models.conftest import TinyBackbone

QWEN = ["qwen2_5_vl", "qwen3_vl"]
ONE_CAMERA = DataSchema(
    name="one-cam", cameras={"top": CameraSpec(height=24, width=20)}, state_dim=3, action_dim=2
)


def _groups(n: int) -> list[tuple[str, DataSchema, ObservationBatch]]:
    return [
        (f"t{i}", ONE_CAMERA, ObservationBatch.synthetic(ONE_CAMERA, 1 + i % 2, seed=i))
        for i in range(n)
    ]


def _qwen(base: ResidentBaseModel) -> QwenVLResident:
    assert isinstance(base.resident, QwenVLResident)
    return base.resident


class _ImagesSeen:
    """Counts the images the vision tower encodes (its ``grid_thw`` rows)."""

    def __init__(self, base: ResidentBaseModel) -> None:
        self.images = 0
        self._handle = base.model.visual.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, _module: object, args: tuple, kwargs: dict) -> None:
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        self.images += int(grid.shape[0])

    def close(self) -> None:
        self._handle.remove()


def test_the_plan_encodes_one_blank_and_maps_every_blank_slot_to_it() -> None:
    mask = torch.tensor([[True, False], [True, False], [False, False]])
    keep, source = blank_plan(mask) or ([], [])
    assert keep == [0, 1, 2]  # the first image, the first blank, the second image
    assert source == [0, 1, 2, 1, 1, 1]
    assert blank_plan(torch.tensor([[True, False], [True, True]])) is None  # one blank


@pytest.mark.parametrize("arch", QWEN)
def test_blank_slots_are_encoded_once_and_the_features_are_unchanged(
    arch: str, tiny_backbone: TinyBackbone
) -> None:
    base = tiny_backbone(arch)
    assert base.shares_blanks and base.num_camera_slots >= 2
    feature = base.canonicalize(_groups(4), validated=False)
    rows = feature.batch_size
    assert feature.blank_plan is not None
    seen = _ImagesSeen(base)
    try:
        with torch.no_grad():
            shared = base.encode(feature)
            encoded_shared = seen.images
            feature.blank_plan = None
            plain = base.encode(feature)
    finally:
        seen.close()
    slots = base.num_camera_slots
    assert encoded_shared == rows + 1  # each row's camera, one blank for the rest
    assert seen.images - encoded_shared == rows * slots
    torch.testing.assert_close(shared.hidden_states, plain.hidden_states, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", QWEN)
def test_the_patch_embedding_equals_its_convolution(arch: str, tiny_backbone: TinyBackbone) -> None:
    embed = tiny_backbone(arch).model.visual.patch_embed
    patches = torch.randn(
        37, embed.proj.weight[0].numel(), generator=torch.Generator().manual_seed(0)
    )
    conv = embed.proj(patches.view(-1, *embed.proj.weight.shape[1:])).view(-1, embed.embed_dim)
    torch.testing.assert_close(embed(patches), conv, rtol=0, atol=1e-5)


def test_rows_with_a_vision_adapter_encode_every_blank(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("qwen2_5_vl")
    lora = LoRAConfig(rank=2, alpha=4.0, targets=("q_proj",), vision=True)
    slots = [
        TenantSlot("v", ONE_CAMERA, base, OFTHeadConfig(hidden_dim=16, lora=lora), seed=1),
        TenantSlot("p", PUSHT, base, OFTHeadConfig(hidden_dim=16), seed=2),
    ]
    executor = GroupedExecutor(base, slots)
    batches = {
        "v": ObservationBatch.synthetic(ONE_CAMERA, 2, seed=1),
        "p": ObservationBatch.synthetic(PUSHT, 2, seed=2),
    }
    seen = _ImagesSeen(base)
    try:
        executor.shared_forward(batches)
    finally:
        seen.close()
    # Each tenant's blank goes through that tenant's own adapter: nothing is shared.
    assert seen.images == 4 * base.num_camera_slots


def test_without_a_plan_every_image_is_encoded(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("qwen2_5_vl")
    feature = base.canonicalize(_groups(3), validated=False)
    seen = _ImagesSeen(base)
    try:
        with torch.no_grad():
            feature.blank_plan = None
            base.encode(feature)
    finally:
        seen.close()
    assert seen.images == feature.batch_size * base.num_camera_slots


@pytest.mark.parametrize("arch", QWEN)
def test_cached_rope_positions_equal_the_models_own(arch: str, tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone(arch)
    assert base.caches_positions
    model = base.model
    texts = ["", "reach", "pick up the red block and put it in the bowl"]
    groups = [
        (
            f"t{i}",
            ONE_CAMERA,
            _with_instruction(ObservationBatch.synthetic(ONE_CAMERA, 2, seed=i), t),
        )
        for i, t in enumerate(texts)
    ]
    for _ in range(2):  # the second pass answers from the cache
        inputs = base.canonicalize(groups).model_inputs
        kwargs = {
            "input_ids": inputs["input_ids"],
            "mm_token_type_ids": inputs["mm_token_type_ids"],
            "image_grid_thw": inputs["image_grid_thw"],
            "attention_mask": inputs["attention_mask"],
        }
        want, _ = model.get_rope_index(**kwargs)
        got = _qwen(base).positions(inputs)
        assert got is not None and torch.equal(got, want)
    feature = base.canonicalize(groups)
    feature.blank_plan = None  # every image, so only the positions and layout differ
    with torch.no_grad():
        ours = base.encode(feature).hidden_states
        # The model's own path: its canonical inputs alone, it computes the rest itself.
        own = Resident.forward(_qwen(base), feature.model_inputs, feature, ()).hidden_states
    torch.testing.assert_close(ours, own, rtol=0, atol=0)


def _with_instruction(batch: ObservationBatch, text: str) -> ObservationBatch:
    return ObservationBatch(
        cameras=batch.cameras, state=batch.state, instructions=[text] * batch.batch_size
    )


@pytest.mark.parametrize("arch", QWEN)
def test_the_towers_precomputed_layout_gives_the_models_own_features(
    arch: str, tiny_backbone: TinyBackbone
) -> None:
    base = tiny_backbone(arch)
    inputs = base.canonicalize(_groups(3), validated=False).model_inputs
    pixels, grid = inputs["pixel_values"], inputs["image_grid_thw"]
    vision = _qwen(base).vision
    assert vision is not None
    with torch.no_grad():
        ours = vision.image_features(pixels, grid, None)  # the layout computed once
        own = base.model.get_image_features(pixels, grid, return_dict=True)  # by the tower
    assert len(ours.pooler_output) == len(own.pooler_output) == int(grid.shape[0])
    for mine, theirs in zip(ours.pooler_output, own.pooler_output, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("arch", QWEN)
def test_equal_attention_segments_are_one_batched_call_with_the_same_output(
    arch: str, tiny_backbone: TinyBackbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    attn = tiny_backbone(arch).model.visual.blocks[0].attn
    assert type(attn).__name__.startswith("SegmentBatched")  # a subclass of its own class
    gen = torch.Generator().manual_seed(0)
    length, segments = 6, 4
    total = length * segments
    hidden = torch.randn(total, attn.qkv.in_features, generator=gen)
    head_dim = attn.qkv.in_features // attn.num_heads
    cos, sin = (torch.randn(total, head_dim, generator=gen) for _ in range(2))
    rope = (cos, sin)
    calls: list[int] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting(q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(int(q.shape[0]))
        return sdpa(q, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    for bounds, batched in (
        (list(range(0, total + 1, length)), [segments]),  # equal: one call, a batch of 4
        ([0, 5, total], [1, 1]),  # unequal: the module's own loop
    ):
        cu = torch.tensor(bounds, dtype=torch.int32)
        calls.clear()
        with torch.no_grad():
            ours = attn(hidden, cu, position_embeddings=rope)
            assert calls == batched
            own = type(attn).own.forward(attn, hidden, cu, position_embeddings=rope)
        torch.testing.assert_close(ours, own, rtol=0, atol=1e-6)


@pytest.mark.parametrize("arch", QWEN)
def test_the_batched_tower_attention_gives_the_models_own_features(
    arch: str, tiny_backbone: TinyBackbone
) -> None:
    base = tiny_backbone(arch)
    feature = base.canonicalize(_groups(3), validated=False)
    blocks = base.model.visual.blocks
    with torch.no_grad():
        ours = base.encode(feature).hidden_states
        batched = [type(block.attn) for block in blocks]
        for block in blocks:
            block.attn.__class__ = type(block.attn).own  # the class's own forward
        try:
            own = base.encode(feature).hidden_states
        finally:
            for block, cls in zip(blocks, batched, strict=True):
                block.attn.__class__ = cls
    torch.testing.assert_close(ours, own, rtol=0, atol=1e-5)
