"""SmolVLA's vision patch positions: which rule a checkpoint is run with, and that the
transformers 5 rule is the one transformers itself computes (this venv's SmolVLM)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.models.smolvlm.configuration_smolvlm import SmolVLMVisionConfig
from transformers.models.smolvlm.modeling_smolvlm import SmolVLMVisionEmbeddings

from joynexus.models.archs.smolvlm.smolvla import patch_buckets, vision_positions


def test_the_rule_follows_the_lerobot_that_wrote_the_checkpoint() -> None:
    tf4, tf5 = (
        SimpleNamespace(transformers_version="4.57.6"),
        SimpleNamespace(transformers_version="5.5.4"),
    )
    # lerobot >= 0.6 writes pretrained_revision (transformers 5), whatever the VLM says.
    assert vision_positions({"pretrained_revision": None}, tf4) == "transformers5"
    # lerobot 0.5 saved its local VLM with transformers 5.
    assert vision_positions({}, tf5) == "transformers5"
    # lerobot <= 0.4 (and lerobot/smolvla_base's hub VLM): transformers 4, as trained.
    assert vision_positions({}, tf4) == "transformers4"
    assert vision_positions({}, SimpleNamespace()) == "transformers4"


@pytest.mark.parametrize(("side", "patches"), [(4, 4), (32, 32), (14, 14), (6, 4)])
def test_transformers5_positions_are_transformers_own(side: int, patches: int) -> None:
    """The position ids this venv's transformers (5.x) gives a whole image of
    ``patches`` per side on a tower of ``side``, read through an embedding whose row
    ``i`` is ``i``; transformers 4 puts every patch but the first one bucket lower."""
    config = SmolVLMVisionConfig(hidden_size=1, image_size=side * 2, patch_size=2, num_channels=1)
    emb = SmolVLMVisionEmbeddings(config)
    with torch.no_grad():
        emb.patch_embedding.weight.zero_()
        emb.patch_embedding.bias.zero_()
        emb.position_embedding.weight.copy_(torch.arange(side * side, dtype=torch.float32)[:, None])
    pixels = torch.zeros(1, 1, patches * 2, patches * 2)
    mask = torch.ones(1, patches, patches, dtype=torch.bool)
    theirs = emb(pixels, mask)[0, :, 0].long()
    rows = patch_buckets(patches, side, "transformers5", torch.float32, pixels.device)
    mine = (rows[:, None] * side + rows[None, :]).flatten()
    assert torch.equal(mine, theirs)
    old = patch_buckets(patches, side, "transformers4", torch.float32, pixels.device)
    if patches == side:
        assert torch.equal(old[1:], rows[1:] - 1) and old[0] == rows[0] == 0
