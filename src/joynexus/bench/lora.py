"""``joynexus bench lora``: mixed-adapter grouped vs serial per-tenant LoRA forwards.

N LoRA tenants (alternating the small LIBERO and CALVIN schemas of the Figure 12 setup)
share one resident backbone. *Grouped* runs ONE backbone forward over every tenant's
rows, each row through its own adapter (:mod:`joynexus.models.lora`); *serial* runs one
forward per tenant through its adapter. Both are timed forward-only and forward +
backward (gradients reach the adapters only). Canonicalization is done before timing,
as in the group-batching benchmark. When ``peft`` is installed, its own mixed-adapter
batch (``adapter_names=`` per row, inference only) over the same adapters and inputs is
timed as the reference implementation.

Grouped, serial (and peft) are timed in turns, one sample of each per repeat, so a
ratio compares runs made under the same load of a shared machine; each is reported as
the median wall time and the median CPU time of this process (``*_cpu_s``,
``cpu_speedup``...), which other processes' load barely moves.

``grouped_vs_serial_max_rel_diff``: forward = largest ``|grouped - serial|`` over real
tokens divided by the largest ``|serial|``, over tenants; gradients = per tenant
``||g_grouped - g_serial|| / ||g_serial||`` over all its adapter tensors, max over
tenants. ``bytes_per_tenant``: the adapter's parameters and its AdamW state (two fp32
moments per parameter), without the (small, rank-independent) action head.

Everything runs on a model built locally by :func:`joynexus.models.tiny.make_tiny`:
nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from joynexus.bench.figure12 import CALVIN_SMALL, LIBERO_SMALL
from joynexus.bench.group_batching import paired_median_times
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.feature import VLAFeature, max_abs_diff_left_padded
from joynexus.models.lora import (
    LoRAAdapter,
    LoRAConfig,
    LoRARows,
    LoRASegment,
    lora_rows,
    save_peft_adapter,
)
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.tiny import make_tiny, quiet_transformers
from joynexus.models.types import BackboneOutput


def _probe_loss(out: BackboneOutput, proj: torch.Tensor) -> torch.Tensor:
    mask = out.attention_mask.unsqueeze(-1).to(out.hidden_states.dtype)
    pooled = (out.hidden_states * mask).sum(dim=1) / mask.sum(dim=1)
    return ((pooled @ proj) ** 2).sum()


def _adapter(slot: TenantSlot) -> LoRAAdapter:
    """The LoRA adapter of a slot this bench built with one."""
    assert slot.lora is not None
    return slot.lora


def _grad(param: torch.nn.Parameter) -> torch.Tensor:
    """A parameter's gradient after a backward pass that reached it."""
    assert param.grad is not None
    return param.grad


def _forward(
    base: ResidentBaseModel, feature: VLAFeature, segments: Sequence[LoRASegment], grad: bool
) -> BackboneOutput:
    rows = LoRARows(feature.batch_size, tuple(segments), training=grad)
    if any(seg.adapter.sees_images for seg in segments):
        rows = rows.with_images(base.images_per_row(feature))
    with lora_rows(rows):
        if grad:
            return base.encode(feature, grad=True)
        with torch.no_grad():
            return base.encode(feature)


def adapter_bytes(slot: TenantSlot) -> dict[str, int]:
    """The adapter's parameter bytes, with its AdamW moments, and the whole slot's
    training footprint (adapter + head + optimizer state)."""
    assert slot.lora is not None
    params = sum(p.numel() * p.element_size() for p in slot.lora.parameters())
    return {
        "adapter": params,
        "adapter_with_optimizer": 3 * params,
        "slot_with_optimizer": slot.training_bytes(),
    }


def _tenants(
    base: ResidentBaseModel, num: int, batch: int, rank: int, vision: bool = False
) -> tuple[list[TenantSlot], dict[str, ObservationBatch]]:
    slots: list[TenantSlot] = []
    batches: dict[str, ObservationBatch] = {}
    for i in range(num):
        schema = LIBERO_SMALL if i % 2 == 0 else CALVIN_SMALL
        lora = LoRAConfig(rank=rank, alpha=2.0 * rank, vision=vision, vision_projection=vision)
        head = OFTHeadConfig(hidden_dim=64, lora=lora)
        slot = TenantSlot(f"t{i}", schema, base, head, seed=i)
        assert slot.lora is not None
        gen = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for b in slot.lora.B.values():
                b.copy_(torch.randn(b.shape, generator=gen) * 0.02)
        slots.append(slot)
        batches[slot.tenant_id] = ObservationBatch.synthetic(schema, batch, seed=i)
    return slots, batches


def _peft_reference(
    base: ResidentBaseModel,
    model_dir: Path,
    slots: Sequence[TenantSlot],
    feature: VLAFeature,
    tmp: Path,
) -> tuple[Callable[[], Any], torch.Tensor] | None:
    if importlib.util.find_spec("peft") is None:
        return None
    import peft
    import transformers

    with quiet_transformers():
        hf: Any = transformers.AutoModel.from_pretrained(str(model_dir), dtype=base.dtype)
    hf = hf.to(base.device)
    model: Any = None
    for slot in slots:
        assert slot.lora is not None
        path = save_peft_adapter(slot.lora, tmp / slot.tenant_id)
        if model is None:
            model = peft.PeftModel.from_pretrained(hf, str(path), adapter_name=slot.tenant_id)
        else:
            model.load_adapter(str(path), adapter_name=slot.tenant_id)
    model.eval()
    names = [e.tenant_id for e in feature.slices for _ in range(e.size)]
    inputs = feature.model_inputs

    def run() -> Any:
        with torch.no_grad():
            return model(**inputs, adapter_names=names, use_cache=False, return_dict=True)

    mask = inputs["attention_mask"]
    hidden = run().last_hidden_state.masked_fill(~mask.bool().unsqueeze(-1), 0.0)
    return run, hidden


def measure_rank(
    base: ResidentBaseModel,
    model_dir: Path,
    *,
    tenants: int,
    batch: int,
    rank: int,
    repeats: int,
    warmup: int,
    peft: bool = True,
    vision: bool = False,
) -> dict[str, Any]:
    """Grouped vs serial (and peft) timings and differences at one adapter rank
    (``vision``: the adapters also cover the vision tower and its projection)."""
    slots, batches = _tenants(base, tenants, batch, rank, vision)
    by_id = {s.tenant_id: s for s in slots}
    groups = [(s.tenant_id, s.schema, batches[s.tenant_id]) for s in slots]
    grouped_feature = base.canonicalize(groups)
    grouped_segments = [
        LoRASegment(e.start, e.stop, _adapter(by_id[e.tenant_id])) for e in grouped_feature.slices
    ]
    serial = [(s, base.canonicalize([g])) for s, g in zip(slots, groups, strict=True)]
    serial_segments = {s.tenant_id: [LoRASegment(0, f.batch_size, _adapter(s))] for s, f in serial}
    proj = torch.randn(
        base.hidden_size, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float32
    ).to(device=base.device, dtype=base.dtype)

    def grouped_fwd() -> BackboneOutput:
        return _forward(base, grouped_feature, grouped_segments, grad=False)

    def serial_fwd() -> list[BackboneOutput]:
        return [_forward(base, f, serial_segments[s.tenant_id], grad=False) for s, f in serial]

    def grouped_train() -> None:
        out = _forward(base, grouped_feature, grouped_segments, grad=True)
        losses = [_probe_loss(out.rows(e.start, e.stop), proj) for e in grouped_feature.slices]
        torch.autograd.backward(torch.stack(losses).sum())

    def serial_train() -> None:
        for s, f in serial:
            out = _forward(base, f, serial_segments[s.tenant_id], grad=True)
            torch.autograd.backward(_probe_loss(out, proj))

    def grads() -> dict[str, torch.Tensor]:
        out = {}
        for s in slots:
            lora = _adapter(s)
            out[s.tenant_id] = torch.cat([_grad(p).flatten() for p in lora.parameters()])
            lora.zero_grad(set_to_none=True)
        return out

    # Differences (fp32 on CPU).
    g_out, s_out = grouped_fwd(), serial_fwd()
    fwd_diff = 0.0
    for (s, _), so in zip(serial, s_out, strict=True):
        e = grouped_feature.slice_of(s.tenant_id)
        go = g_out.rows(e.start, e.stop)
        d = max_abs_diff_left_padded(
            go.hidden_states, go.attention_mask, so.hidden_states, so.attention_mask
        )
        fwd_diff = max(fwd_diff, d / float(so.hidden_states.abs().max()))
    grouped_train()
    g_grads = grads()
    serial_train()
    s_grads = grads()
    grad_diff = max(
        float((g_grads[t] - s_grads[t]).norm() / s_grads[t].norm().clamp_min(1e-30))
        for t in g_grads
    )

    device = base.device
    result: dict[str, Any] = {
        "rank": rank,
        "forward_max_rel_diff": fwd_diff,
        "gradient_max_rel_diff": grad_diff,
        "peft_max_rel_diff": None,
    }

    def timed_train(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            fn()
            grads()

        return run

    forwards: dict[str, Callable[[], object]] = {"grouped": grouped_fwd, "serial": serial_fwd}
    with tempfile.TemporaryDirectory() as tmp:
        ref = _peft_reference(base, model_dir, slots, grouped_feature, Path(tmp)) if peft else None
        if ref is not None:
            run, hidden = ref
            mask = grouped_feature.model_inputs["attention_mask"]
            result["peft_max_rel_diff"] = max_abs_diff_left_padded(
                g_out.hidden_states, mask, hidden, mask
            ) / float(hidden.abs().max())
            forwards["peft"] = run
        # Each pair (and peft) is timed in turns: a ratio is then taken under one load.
        times = paired_median_times(forwards, device, repeats, warmup)
    trains = {
        "grouped_train": timed_train(grouped_train),
        "serial_train": timed_train(serial_train),
    }
    times.update(paired_median_times(trains, device, repeats, warmup))
    for name, (wall, cpu) in times.items():
        result[f"{name}_s"] = wall
        result[f"{name}_cpu_s"] = cpu
    result["speedup"] = result["serial_s"] / result["grouped_s"]
    result["train_speedup"] = result["serial_train_s"] / result["grouped_train_s"]
    result["cpu_speedup"] = result["serial_cpu_s"] / result["grouped_cpu_s"]
    result["train_cpu_speedup"] = result["serial_train_cpu_s"] / result["grouped_train_cpu_s"]
    result.update(adapter_bytes(slots[0]))
    result["peft_speedup"] = result["peft_cpu_speedup"] = None
    if "peft" in times:
        result["peft_speedup"] = result["peft_s"] / result["grouped_s"]
        result["peft_cpu_speedup"] = result["peft_cpu_s"] / result["grouped_cpu_s"]
    else:
        result["peft_s"] = result["peft_cpu_s"] = None
    return result


def run_lora_bench(
    *,
    arch: str = "qwen2_5_vl",
    size: str = "tiny",
    tenants: int = 8,
    batch: int = 1,
    ranks: Sequence[int] = (8, 32),
    device: str = "cpu",
    repeats: int = 5,
    warmup: int = 2,
    threads: int | None = None,
    model_dir: Path | None = None,
    peft: bool = True,
    budget_bytes: int = 1 << 30,
    vision: bool = False,
) -> dict[str, Any]:
    """Measure every rank; top-level figures are those of the first rank.

    ``capacity``: how many such LoRA tenants (adapter + head + AdamW state) fit in
    ``budget_bytes`` of tenant memory next to the one shared base (the executor's
    ``tenant_memory_budget`` refuses the next one).
    """
    if threads is not None:
        torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir or make_tiny(arch, Path(tmp) / "m", size=size, seed=0)
        base = ResidentBaseModel.from_pretrained(str(path), device=device)
        by_rank = {
            str(r): measure_rank(
                base,
                path,
                tenants=tenants,
                batch=batch,
                rank=r,
                repeats=repeats,
                warmup=warmup,
                # peft's mixed batch names adapters per sample; a vision layer's rows
                # are images, which it cannot assign.
                peft=peft and not vision,
                vision=vision,
            )
            for r in ranks
        }
    first = by_rank[str(ranks[0])]
    return {
        "arch": arch,
        "size": size,
        "device": device,
        "dtype": str(base.dtype).removeprefix("torch."),
        "tenants": tenants,
        "batch": batch,
        "vision": vision,
        "threads": torch.get_num_threads(),
        "grouped_vs_serial_max_rel_diff": {
            "forward": max(r["forward_max_rel_diff"] for r in by_rank.values()),
            "gradients": max(r["gradient_max_rel_diff"] for r in by_rank.values()),
        },
        "speedup": first["speedup"],
        "train_speedup": first["train_speedup"],
        "peft_speedup": first["peft_speedup"],
        "cpu_speedup": first["cpu_speedup"],
        "train_cpu_speedup": first["train_cpu_speedup"],
        "peft_cpu_speedup": first["peft_cpu_speedup"],
        "bytes_per_tenant": {
            r: {k: v[k] for k in ("adapter", "adapter_with_optimizer", "slot_with_optimizer")}
            for r, v in by_rank.items()
        },
        "base_bytes": base.parameter_bytes(),
        "capacity": {
            "budget_bytes": budget_bytes,
            "tenants": {r: budget_bytes // v["slot_with_optimizer"] for r, v in by_rank.items()},
        },
        "by_rank": by_rank,
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_report(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"LoRA mixed-adapter forward{' (+ vision tower)' if result['vision'] else ''}, "
        f"{result['tenants']} tenants x batch "
        f"{result['batch']} ({result['arch']} {result['size']}, {result['device']} "
        f"{result['dtype']})"
    )
    for col in (
        "rank",
        "grouped ms",
        "serial ms",
        "speedup",
        "train grouped ms",
        "train serial ms",
        "train speedup",
        "peft ms",
        "peft speedup",
        "CPU-time speedup fwd / train / peft",
        "fwd rel diff",
        "grad rel diff",
        "bytes/tenant (+AdamW)",
    ):
        table.add_column(col, justify="right")
    for r, v in result["by_rank"].items():
        table.add_row(
            r,
            f"{v['grouped_s'] * 1e3:.1f}",
            f"{v['serial_s'] * 1e3:.1f}",
            f"{v['speedup']:.2f}x",
            f"{v['grouped_train_s'] * 1e3:.1f}",
            f"{v['serial_train_s'] * 1e3:.1f}",
            f"{v['train_speedup']:.2f}x",
            _fmt(None if v["peft_s"] is None else v["peft_s"] * 1e3, ".1f"),
            _fmt(v["peft_speedup"], ".2f"),
            f"{v['cpu_speedup']:.2f} / {v['train_cpu_speedup']:.2f} / "
            + _fmt(v["peft_cpu_speedup"], ".2f"),
            f"{v['forward_max_rel_diff']:.1e}",
            f"{v['gradient_max_rel_diff']:.1e}",
            f"{v['adapter_with_optimizer']:,}",
        )
    console.print(table)
    cap = result["capacity"]
    fits = ", ".join(f"rank {r}: {n:,}" for r, n in cap["tenants"].items())
    console.print(
        f"LoRA tenants within a {cap['budget_bytes'] / 2**20:,.0f} MiB tenant memory budget "
        f"(adapter + head + AdamW state; base {result['base_bytes']:,} bytes shared once): "
        f"{fits}"
    )
