"""The tenant's own image encoder: images reach the head, keypoints locate, a head learns
where a dot is from pixels that its pooled features alone do not give it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from joynexus.errors import InvalidRequestError
from joynexus.models.batch import ObservationBatch
from joynexus.models.policies import OFTHead, OFTHeadConfig, build_action_module
from joynexus.models.policies.base import features_as
from joynexus.models.policies.image_encoder import ImageEncoderConfig, SpatialSoftmaxEncoder
from joynexus.models.schema import LIBERO, PUSHT
from joynexus.models.types import BackboneOutput
from tests.models.conftest import TinyBackbone

SIDE = 32


def _dots(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` grey frames, each with one white 3×3 dot; the dot's (x, y) in [-1, 1]
    (+y up)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(2, SIDE - 2, (n,), generator=g)
    cols = torch.randint(2, SIDE - 2, (n,), generator=g)
    images = torch.full((n, 1, 3, SIDE, SIDE), 100, dtype=torch.uint8)
    for i in range(n):
        r, c = int(rows[i]), int(cols[i])
        images[i, 0, :, r - 1 : r + 2, c - 1 : c + 2] = 255
    xy = torch.stack(
        [(cols.float() + 0.5) / SIDE * 2 - 1, 1 - (rows.float() + 0.5) / SIDE * 2], dim=1
    )
    return images, xy


def _features(images: torch.Tensor | None, seed: int = 0) -> BackboneOutput:
    # Features that say nothing about the image: what the head must do without them.
    b = 1 if images is None else int(images.shape[0])
    hs = torch.randn(b, 4, 16, generator=torch.Generator().manual_seed(seed))
    return BackboneOutput(
        hidden_states=hs, attention_mask=torch.ones(b, 4, dtype=torch.long), images=images
    )


def _head(encoder: bool) -> OFTHead:
    torch.manual_seed(0)
    config = OFTHeadConfig(
        hidden_dim=64, image_encoder=ImageEncoderConfig(size=SIDE, channels=8) if encoder else None
    )
    return OFTHead(config, hidden_size=16, state_dim=0, action_dim=2, action_chunk=1)


def _train(head: OFTHead, steps: int) -> float:
    """L1 on held-out dots after ``steps`` of Adam on the dot's position."""
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    images, xy = _dots(256, seed=1)
    state = torch.zeros(256, 0)
    for step in range(steps):
        rows = slice((step * 32) % 256, (step * 32) % 256 + 32)
        loss = head.loss(_features(images[rows], seed=step), state[rows], xy[rows, None])
        opt.zero_grad()
        loss.backward()
        opt.step()
    test_images, test_xy = _dots(64, seed=2)
    head.eval()
    with torch.no_grad():
        return float(
            head.loss(_features(test_images, seed=99), torch.zeros(64, 0), test_xy[:, None])
        )


def test_a_head_with_the_image_encoder_learns_where_the_dot_is() -> None:
    with_encoder = _train(_head(encoder=True), steps=150)
    without = _train(_head(encoder=False), steps=150)
    # Predicting the mean position gives ~0.5; the features alone carry nothing.
    assert without > 0.35
    assert with_encoder < 0.15
    assert with_encoder < without / 3


def test_keypoints_follow_the_dot() -> None:
    torch.manual_seed(0)
    enc = SpatialSoftmaxEncoder(ImageEncoderConfig(size=SIDE, channels=4, keypoints=2), 1, 8)
    with torch.no_grad():
        # An identity-like read-out: the first map is the image's brightness, sharpened.
        for conv in enc.convs:
            if isinstance(conv, torch.nn.Conv2d):
                conv.weight.zero_()
                conv.bias.zero_()
                conv.weight[:, :, conv.kernel_size[0] // 2, conv.kernel_size[1] // 2] = 1.0
        enc.log_temperature.fill_(3.0)
    images, xy = _dots(4, seed=3)
    kp = enc.keypoints(images)
    assert kp.shape == (4, 1, 2, 2)
    # The stride-2 first layer halves the grid: the keypoint is the dot within a cell.
    assert torch.allclose(kp[:, 0, 0], xy, atol=2.5 / SIDE * 2)


def test_without_images_or_with_too_few_slots_the_error_says_so() -> None:
    head = _head(encoder=True)
    with pytest.raises(InvalidRequestError, match="canonical camera images"):
        head.predict(_features(None), torch.zeros(1, 0))
    enc = SpatialSoftmaxEncoder(ImageEncoderConfig(size=SIDE), num_cameras=2, out_dim=8)
    with pytest.raises(InvalidRequestError, match="2 camera slot"):
        enc(torch.zeros(1, 1, 3, SIDE, SIDE, dtype=torch.uint8))
    with pytest.raises(ValidationError):
        OFTHeadConfig(image_encoder={"size": 4})
    with pytest.raises(ValidationError):
        OFTHeadConfig(image_encoder={"colour": True})


def test_the_backbone_hands_its_canonical_images_to_the_head(
    tiny_backbone: TinyBackbone,
) -> None:
    base = tiny_backbone("qwen2_5_vl")
    batch = ObservationBatch.synthetic(LIBERO, 3, seed=0)
    feature = base.canonicalize(
        [("a", LIBERO, batch), ("b", PUSHT, ObservationBatch.synthetic(PUSHT, 2, seed=1))]
    )
    out = base.encode(feature)
    size = base.canonical_image_size
    assert out.images is not None and out.images.dtype == torch.uint8
    assert out.images.shape == (5, base.num_camera_slots, 3, size, size)
    assert torch.equal(out.images, feature.images)
    # Tenant b's rows, as the grouped step slices them; PushT's one camera fills slot 0
    # and the absent slot is blank.
    rows = out.rows(3, 5)
    assert rows.images is not None and torch.equal(rows.images, out.images[3:5])
    assert int(rows.images[:, 1].max()) == 0 and int(rows.images[:, 0].max()) > 0
    assert out.detach().images is out.images
    # A head of another dtype gets the same pixels, untouched.
    head = build_action_module(
        OFTHeadConfig(hidden_dim=32, image_encoder={"size": 32}),
        hidden_size=base.hidden_size,
        schema=LIBERO,
        base=base,
    ).double()
    moved = features_as(out.rows(0, 3), head)
    assert moved.hidden_states.dtype == torch.float64
    assert moved.images is not None and torch.equal(moved.images, out.images[:3])
    actions = head.predict(moved, torch.from_numpy(np.asarray(batch.state)).double())
    assert actions.shape == (3, LIBERO.action_chunk, LIBERO.action_dim)
    assert torch.isfinite(actions).all()


def test_the_critic_of_a_tenant_with_an_image_encoder_sees_the_image(
    tiny_backbone: TinyBackbone,
) -> None:
    from joynexus.services.tenancy import TenantConfig, build_slot

    base = tiny_backbone("qwen2_5_vl")
    config = TenantConfig(
        tenant_id="px",
        schema=PUSHT,
        head=OFTHeadConfig(hidden_dim=32, image_encoder={"size": 32}),
        value_head=True,
    )
    slot = build_slot(config, base)
    critic = slot.value_head
    assert critic is not None and critic.image_encoder is not None
    assert critic.image_encoder is not getattr(slot.action_module, "image_encoder", None)
    # Its output moves with the pixels alone (same tokens, same state).
    images, _ = _dots(2, seed=5)
    images = images.expand(2, base.num_camera_slots, 3, SIDE, SIDE).contiguous()
    hs = torch.randn(1, 4, base.hidden_size).expand(2, 4, base.hidden_size)
    with torch.no_grad():
        critic.out.weight.normal_()
        values = critic(
            BackboneOutput(
                hidden_states=hs, attention_mask=torch.ones(2, 4, dtype=torch.long), images=images
            ),
            torch.zeros(2, PUSHT.state_dim),
        )
    assert not torch.isclose(values[0], values[1])
    # Without an encoder on the head, the critic has none either.
    plain = build_slot(config.model_copy(update={"head": OFTHeadConfig(hidden_dim=32)}), base)
    assert plain.value_head is not None and plain.value_head.image_encoder is None
