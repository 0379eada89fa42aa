"""``joynexus bench canonicalize``: the tensor canonicalizer against the processor.

For every tiny architecture, the same multi-tenant groups (8 tenants, odd camera sizes,
one and two cameras, an empty and a long instruction) are canonicalized by both paths
of one resident backbone: the largest |difference| of any model input (the processor is
the reference; the tests hold it within 1e-6) and the median milliseconds per batch of
each path, on one torch thread. Nothing is downloaded: the models are built offline.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.canonicalize import canonicalize
from joynexus.models.canon.tensor import TensorCanonicalizer, max_abs_difference, mismatch
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.models.tiny import ARCHES, make_tiny

__all__ = ["run_canonicalize_bench"]

_LONG = "pick up the red block and put it in the bowl, then close the drawer " * 8


def _groups(tenants: int) -> list[tuple[str, DataSchema, ObservationBatch]]:
    """``tenants`` one-row groups: odd sizes, one or two cameras, varied prompts."""
    groups = []
    texts = ["reach the target", "", _LONG, "open the top drawer of the cabinet"]
    for i in range(tenants):
        shapes = [(23 + i, 41)] if i % 2 else [(32, 32), (17, 9 + i)]
        schema = DataSchema(
            name=f"s{i}",
            cameras={f"c{k}": CameraSpec(height=h, width=w) for k, (h, w) in enumerate(shapes)},
            state_dim=4,
            action_dim=2,
            action_chunk=2,
        )
        b = ObservationBatch.synthetic(schema, 1, seed=i, with_actions=False)
        batch = ObservationBatch(
            cameras=b.cameras, state=b.state, instructions=[texts[i % len(texts)]]
        )
        groups.append((f"t{i}", schema, batch))
    return groups


def _timed(
    base: ResidentBaseModel,
    groups: list[tuple[str, DataSchema, ObservationBatch]],
    encoder: TensorCanonicalizer,
    repeats: int,
) -> dict[str, list[float]]:
    """Seconds per call of each path, the two interleaved call by call (so a burst of
    load on a shared machine hits both alike)."""
    signatures = [base.signature_for(schema) for _, schema, _ in groups]
    paths: dict[str, TensorCanonicalizer | None] = {"tensor": encoder, "processor": None}
    times: dict[str, list[float]] = {k: [] for k in paths}
    for i in range(repeats + 1):
        for name, enc in paths.items():
            start = time.perf_counter()
            feature = canonicalize(
                base.processor,
                base._spec,
                groups,
                signatures=signatures,
                encoder=enc,
                device=base.device,
            )
            # What the backbone does next either way: its dtype, on its device.
            moved = [v.to(base.device) for v in feature.model_inputs.values()]
            if base.device.type == "cuda":
                torch.cuda.synchronize(base.device)
            del moved
            if i:  # the first round warms the prompt cache and the allocator
                times[name].append(time.perf_counter() - start)
    return times


def run_canonicalize_bench(
    *,
    arches: Sequence[str] = ARCHES,
    size: str = "tiny",
    tenants: int = 8,
    repeats: int = 20,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Per architecture: equality figures and ms per batch of both paths (JSON-ready).

    On ``device="cuda"`` the backbone is bf16 and the tensor path lays the pixels out on
    the GPU (the processor's stay on CPU until the backbone casts and copies them); each
    timed call ends with a device synchronization.
    """
    say = progress or (lambda _line: None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="joynexus-bench-canon-") as tmp:
            for arch in arches:
                say(f"{arch}: building the {size} model")
                path = make_tiny(arch, Path(tmp) / arch, size=size)
                base = ResidentBaseModel.from_pretrained(str(path), device=device)
                groups = _groups(tenants)
                encoder, why = TensorCanonicalizer.build(base.processor, base._spec)
                if encoder is None:
                    rows[arch] = {"equal": False, "why": why}
                    continue
                tensor = base.canonicalize(groups)
                base.use_canonicalizer("processor")
                reference = base.canonicalize(groups)
                ref, got = reference.model_inputs, tensor.model_inputs
                times = _timed(base, groups, encoder, repeats)
                ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                rows[arch] = {
                    "inputs": sorted(ref),
                    "equal": mismatch(ref, got) is None,
                    "max_abs_difference": max_abs_difference(ref, got),
                    "bit_identical": all(torch.equal(ref[k], got[k]) for k in ref),
                    "tensor_ms_per_batch": ms["tensor"],
                    "processor_ms_per_batch": ms["processor"],
                    "tensor_min_ms": min(times["tensor"]) * 1e3,
                    "processor_min_ms": min(times["processor"]) * 1e3,
                    "speedup": ms["processor"] / ms["tensor"],
                }
    finally:
        torch.set_num_threads(threads)
    return {
        "config": {
            "size": size,
            "tenants": tenants,
            "rows_per_batch": tenants,
            "repeats": repeats,
            "device": device,
        },
        "arches": rows,
    }


def print_report(result: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    cfg = result["config"]
    table = Table(
        "arch",
        "max |diff|",
        "bit-identical",
        "tensor ms (min)",
        "processor ms (min)",
        "speedup",
        title=f"canonicalization, {cfg['tenants']} tenants x 1 row, {cfg['size']} models "
        "(processor = reference; ms per batch, median and min, 1 thread)",
    )
    for arch, r in result["arches"].items():
        if not r["equal"]:
            table.add_row(arch, f"MISMATCH: {r.get('why', '')}", "", "", "", "")
            continue
        table.add_row(
            arch,
            f"{r['max_abs_difference']:.1e}",
            "yes" if r["bit_identical"] else "no",
            f"{r['tensor_ms_per_batch']:.2f} ({r['tensor_min_ms']:.2f})",
            f"{r['processor_ms_per_batch']:.2f} ({r['processor_min_ms']:.2f})",
            f"{r['speedup']:.1f}x",
        )
    console.print(table)
