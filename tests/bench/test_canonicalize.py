"""``joynexus bench canonicalize``: both paths measured, equality reported per arch."""

from __future__ import annotations

from joynexus.bench.canonicalize import run_canonicalize_bench


def test_the_bench_reports_equal_inputs_and_both_timings() -> None:
    result = run_canonicalize_bench(arches=["qwen2_5_vl"], tenants=3, repeats=2)
    row = result["arches"]["qwen2_5_vl"]
    assert row["equal"] and row["max_abs_difference"] <= 1e-6
    assert {"pixel_values", "image_grid_thw", "input_ids", "attention_mask"} <= set(row["inputs"])
    assert row["tensor_ms_per_batch"] > 0 and row["processor_ms_per_batch"] > 0
