"""`bench.roofline`: FLOPs counted by torch, the device's peak, the speedup ceiling."""

from __future__ import annotations

import pytest
import torch

from joynexus.bench.roofline import count_flops, model_widths, peak_gemm_gflops, roofline


def test_count_flops_counts_a_matrix_product_and_a_linear_layer() -> None:
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    assert count_flops(lambda: a @ b) == 2 * 16 * 32 * 8
    layer = torch.nn.Linear(32, 8)
    # Element-wise work (the bias add, an activation) is not counted: only the product.
    assert count_flops(lambda: torch.relu(layer(a))) == 2 * 16 * 32 * 8


def test_model_widths_prefers_the_shape_every_block_repeats() -> None:
    blocks = [torch.nn.Linear(64, 128) for _ in range(6)]
    head = torch.nn.Linear(64, 512)  # larger, but once: 6 x 64 x 128 outweighs it
    model = torch.nn.Sequential(*blocks, head, torch.nn.Linear(4, 4))
    widths = model_widths(model)
    assert widths[0] == (64, 128) and widths[1] == (64, 512)
    assert (
        len(model_widths(torch.nn.Sequential(*[torch.nn.Linear(i, i) for i in range(1, 9)]))) == 4
    )


def test_peak_is_a_positive_rate_and_rejects_no_widths() -> None:
    peak = peak_gemm_gflops([(32, 32)], device=torch.device("cpu"), dtype=torch.float32, rows=64)
    assert peak > 0
    with pytest.raises(ValueError, match="positive"):
        peak_gemm_gflops([], device=torch.device("cpu"), dtype=torch.float32)
    with pytest.raises(ValueError, match="positive"):
        peak_gemm_gflops([(0, 8)], device=torch.device("cpu"), dtype=torch.float32)


def test_roofline_ceiling_is_the_peak_over_the_serial_rate() -> None:
    roof = roofline(flops=int(40e9), serial_s=2.0, grouped_s=1.0, peak_gflops=50.0)
    assert roof["serial_gflops_per_s"] == pytest.approx(20.0)
    assert roof["grouped_gflops_per_s"] == pytest.approx(40.0)
    # Serial already ran at 20 of the device's 50 GFLOP/s: grouping can give 2.5x at most.
    assert roof["speedup_ceiling"] == pytest.approx(2.5)
