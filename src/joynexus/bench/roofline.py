"""How much faster grouping *can* make a forward on this device: its compute ceiling.

Group batching pays off by turning many small matrix products into one large one. When
a single row's forward is already a large product — a real-size backbone reads ~1,000
tokens per 512 px image — the device may already run it near its best rate, and no
grouping can go past that rate. This module measures both sides, so a bench can say
whether a speedup it did not reach was reachable at all:

* :func:`count_flops` — the floating-point work of one call, counted by torch's own
  :class:`~torch.utils.flop_counter.FlopCounterMode` (matrix products, convolutions and
  the attention kernels it knows; element-wise work is not counted, so the rate below is
  a lower bound of what the device did and the ceiling an upper bound of what it can do).
* :func:`peak_gemm_gflops` — the best rate this device reached on large matrix products
  at the model's own widths, with the bench's threads.

``ceiling = peak / (flops / serial_s)``: the speedup a grouped forward would have if it
ran every counted FLOP at the device's best measured rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["count_flops", "model_widths", "peak_gemm_gflops", "roofline"]

#: Rows of the large products the peak is measured on (several grouped rows' tokens).
PEAK_ROWS = 4096


def count_flops(fn: Callable[[], object]) -> int:
    """Run ``fn`` once (untimed) and return the FLOPs torch counted in it."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def peak_gemm_gflops(
    widths: Iterable[tuple[int, int]],
    *,
    device: torch.device,
    dtype: torch.dtype,
    rows: int = PEAK_ROWS,
    repeats: int = 3,
) -> float:
    """The best GFLOP/s of ``rows x k @ k x n`` products over ``widths`` (``(k, n)`` pairs).

    Each shape is timed ``repeats`` times after one untimed call; the fastest run counts
    (a peak is what the device *can* do, so noise from other processes is dropped).

    Raises:
        ValueError: ``widths`` is empty or a width is not positive.
    """
    shapes = list(widths)
    if not shapes or min(min(s) for s in shapes) < 1:
        raise ValueError(f"peak_gemm_gflops needs positive (k, n) widths, got {shapes}")
    best = 0.0
    for k, n in shapes:
        a = torch.randn(rows, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        torch.mm(a, b)
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            torch.mm(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
            best = max(best, 2 * rows * k * n / elapsed / 1e9)
    return best


def model_widths(model: torch.nn.Module) -> list[tuple[int, int]]:
    """The ``(in, out)`` widths of the linear layers holding most of the model's weights
    (at most four): a shape repeated in every block outweighs a one-off output head."""
    seen: dict[tuple[int, int], int] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            shape = (module.in_features, module.out_features)
            seen[shape] = seen.get(shape, 0) + 1
    return sorted(seen, key=lambda s: seen[s] * s[0] * s[1], reverse=True)[:4]


def roofline(flops: int, serial_s: float, grouped_s: float, peak_gflops: float) -> dict[str, float]:
    """The achieved rates of a serial and a grouped pass over the same work, and the
    speedup the device's peak would allow (``speedup_ceiling``)."""
    serial_rate = flops / serial_s / 1e9 if serial_s > 0 else float("inf")
    grouped_rate = flops / grouped_s / 1e9 if grouped_s > 0 else float("inf")
    return {
        "flops": float(flops),
        "serial_gflops_per_s": serial_rate,
        "grouped_gflops_per_s": grouped_rate,
        "peak_gemm_gflops_per_s": peak_gflops,
        "speedup_ceiling": peak_gflops / serial_rate if serial_rate > 0 else float("inf"),
    }
