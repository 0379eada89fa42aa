"""The real-size configurations (``--size real``) have the published shapes.

Counted on the meta device: no real-size weights are allocated here.
"""

import pytest

from joynexus.bench.real_models import REAL_SPECS, meta_parameters, real_config

#: Parameter counts within this fraction of the published checkpoints'.
TOLERANCE = 0.02


@pytest.mark.parametrize(
    ("arch", "published"),
    [("smolvla", 507_000_000), ("qwen2_5_vl", 3_750_000_000)],
)
def test_published_configuration_has_the_published_parameter_count(
    arch: str, published: int
) -> None:
    """SmolVLM2-500M (SmolVLA's VLM) and Qwen2.5-VL-3B, every layer and the real
    vocabulary: the builders' widths, heads and vision towers are the published ones."""
    assert REAL_SPECS[arch].published_parameters == published
    count = meta_parameters(arch, published=True)
    assert abs(count - published) / published < TOLERANCE, count


def test_smolvla_prefix_is_what_smolvla_base_runs() -> None:
    """num_vlm_layers=16 of SmolVLM2-500M's 32, SigLIP-B/16 at 512 px, pixel shuffle x4:
    64 tokens per camera; the full vocabulary."""
    cfg = real_config("smolvla")
    text, vision = cfg.text_config, cfg.vision_config
    assert (text.hidden_size, text.intermediate_size) == (960, 2560)
    assert (text.num_attention_heads, text.num_key_value_heads) == (15, 5)
    assert text.num_hidden_layers == 16 and text.vocab_size == 49_280
    assert (vision.hidden_size, vision.num_hidden_layers, vision.image_size) == (768, 12, 512)
    tokens = (vision.image_size // vision.patch_size) ** 2 // cfg.scale_factor**2
    assert tokens == REAL_SPECS["smolvla"].image_tokens_per_camera == 64
    # The prefix: SmolVLM2-500M less 16 text layers (~9.8 M each); ~350 M parameters.
    assert 330e6 < meta_parameters("smolvla") < 370e6


def test_qwen_is_a_few_hundred_million_at_3b_widths() -> None:
    cfg = real_config("qwen2_5_vl")
    text, vision = cfg.text_config, cfg.vision_config
    assert (text.hidden_size, text.intermediate_size, text.num_key_value_heads) == (2048, 11008, 2)
    assert text.num_hidden_layers == REAL_SPECS["qwen2_5_vl"].text_layers == 4
    assert (vision.hidden_size, vision.depth, vision.fullatt_block_indexes) == (1280, 8, [7])
    assert 300e6 < meta_parameters("qwen2_5_vl") < 700e6


def test_unknown_real_arch_is_refused() -> None:
    with pytest.raises(ValueError, match="smolvla"):
        real_config("paligemma")
