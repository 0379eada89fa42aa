"""Group-batching benchmark: shared-forward throughput, serial vs grouped (paper §5.2).

For every (tenant count, local batch size) cell, tenants alternate between the LIBERO
and CALVIN schemas. *Serial* runs one backbone forward per tenant; *grouped* runs one
forward over the concatenation of all tenants' canonical inputs. Canonicalization is
done before timing (it is per-sample CPU work, the same total either way) and reported
separately, so ``serial_s``/``grouped_s`` isolate the shared forward stage, as Figure 10
does. The breakdown (Figure 11) sets that stage next to the tenant-private action-module
forward (OFT and flow-matching heads at their default sizes).

Everything runs on a model built locally by :func:`joynexus.models.tiny.make_tiny` (or,
``size="real"``, :func:`joynexus.bench.real_models.build_real`: SmolVLA's VLM prefix or a
Qwen2.5-VL at published widths, random weights) and loaded through ``from_pretrained``:
nothing is downloaded. Memory is measured: this process's RSS before and after loading
the backbone and its peak over the forwards (and torch's allocator peak on a GPU).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from joynexus.bench.memory import PeakRss, rss_mb
from joynexus.bench.roofline import count_flops, model_widths, peak_gemm_gflops, roofline
from joynexus.models.archs.lerobot_pi.checkpoint import Pi05Checkpoint
from joynexus.models.archs.smolvlm.resident import SMOLVLA_ARCH, SmolVLAResident
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.feature import VLAFeature, max_abs_diff_left_padded
from joynexus.models.policies import FlowMatchingHeadConfig, OFTHeadConfig, PolicyConfig
from joynexus.models.policies.pi05_expert import Pi05ExpertConfig
from joynexus.models.policies.smolvla_expert import SmolVLAExpertConfig
from joynexus.models.schema import CALVIN, LIBERO, DataSchema
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.tiny import make_tiny
from joynexus.models.types import BackboneOutput

Group = tuple[str, DataSchema, ObservationBatch]
#: ``--size real``: :mod:`joynexus.bench.real_models`'s configurations.
REAL_SIZE = "real"
#: ``--arch pi05``: a LeRobot π0.5 saved by lerobot 0.6.1 (the reference environment).
PI05 = "pi05"
#: What ``--arch pi05 --size real`` builds.
PI05_REAL = (
    "lerobot PI05Config at its defaults: the gemma_300m variants (~1.9 B parameters), "
    "224 px cameras, random weights"
)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(
    fn: Callable[[], object], device: torch.device, repeats: int, warmup: int
) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _fit(base: ResidentBaseModel, schema: DataSchema) -> DataSchema:
    """``schema`` cut to what a pretrained checkpoint's expert serves (SmolVLA, π0.5:
    its state/action widths and chunk); unchanged on a bare VLM."""
    smolvla = base.extension(SmolVLAResident)
    pi05 = base.extension(Pi05Checkpoint)
    if smolvla is not None:
        limits = (smolvla.ckpt.max_state_dim, smolvla.ckpt.max_action_dim, smolvla.ckpt.chunk_size)
    elif pi05 is not None:
        limits = (pi05.max_state_dim, pi05.max_action_dim, pi05.chunk_size)
    else:
        return schema
    return schema.model_copy(
        update={
            "state_dim": min(schema.state_dim, limits[0]),
            "action_dim": min(schema.action_dim, limits[1]),
            "action_chunk": min(schema.action_chunk, limits[2]),
        }
    )


def paired_median_times(
    fns: Mapping[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int
) -> dict[str, tuple[float, float]]:
    """Median wall and process-CPU seconds of each of ``fns``, timed in turns.

    Each repeat runs every function once, in rotating order, so that on a shared machine
    a burst of someone else's load hits all of them alike and the ratios between them
    stay meaningful (timing one function's repeats after the other's does not).
    Process CPU time counts this process's work only (on CPU; on a GPU it is the host
    side), a second view that other processes' load barely moves.

    Returns:
        name → ``(wall_s, cpu_s)``.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for i in range(repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            _sync(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            fns[name]()
            _sync(device)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {n: (statistics.median(wall[n]), statistics.median(cpu[n])) for n in names}


def tenant_groups(
    base: ResidentBaseModel, num_tenants: int, batch: int, seed: int = 0
) -> list[Group]:
    """``num_tenants`` tenants' synthetic batches of ``batch`` rows, LIBERO-like and
    CALVIN-like schemas in turn, fitted to ``base``'s camera slots."""
    out: list[Group] = []
    for i in range(num_tenants):
        schema = _fit(base, LIBERO if i % 2 == 0 else CALVIN)
        obs = ObservationBatch.synthetic(schema, batch, seed=seed + 1000 * i + batch)
        out.append((f"{schema.name}-{i}", schema, obs))
    return out


def _encode_all(base: ResidentBaseModel, features: Sequence[VLAFeature]) -> list[BackboneOutput]:
    return [base.encode(f) for f in features]


def _max_diff(
    grouped_feature: VLAFeature,
    grouped: BackboneOutput,
    serial: Sequence[BackboneOutput],
    *,
    right_padded: bool = False,
) -> float:
    worst = 0.0
    for entry, out in zip(grouped_feature.slices, serial, strict=True):
        rows = grouped.rows(entry.start, entry.stop)
        worst = max(
            worst,
            max_abs_diff_left_padded(
                rows.hidden_states,
                rows.attention_mask,
                out.hidden_states,
                out.attention_mask,
                right_padded=right_padded,
            ),
        )
    return worst


def _lerobot_prefix(base: ResidentBaseModel) -> bool:
    return base.extension(SmolVLAResident) is not None or base.extension(Pi05Checkpoint) is not None


def measure_cell(
    base: ResidentBaseModel,
    num_tenants: int,
    batch: int,
    *,
    repeats: int,
    warmup: int,
    peak_gflops: float | None = None,
) -> dict[str, Any]:
    """Time serial vs grouped shared forward for one grid cell.

    With ``peak_gflops`` (the device's best matrix-product rate), the serial pass's
    FLOPs are counted first, in an untimed pass, and the cell carries its ``roofline``:
    the rates both passes reached and the speedup that peak would allow.
    """
    groups = tenant_groups(base, num_tenants, batch)
    device = base.device
    start = time.perf_counter()
    serial_features = [base.canonicalize([g]) for g in groups]
    canon_serial = time.perf_counter() - start
    start = time.perf_counter()
    grouped_feature = base.canonicalize(groups)
    canon_grouped = time.perf_counter() - start
    # The last timed outputs are compared (not a fresh pass of each: at real size on a
    # CPU one pass takes minutes).
    last: dict[str, Any] = {}

    def serial() -> None:
        last["serial"] = _encode_all(base, serial_features)

    def grouped() -> None:
        last["grouped"] = base.encode(grouped_feature)

    flops = None if peak_gflops is None else count_flops(serial)
    serial_s = _median_time(serial, device, repeats=repeats, warmup=warmup)
    grouped_s = _median_time(grouped, device, repeats=repeats, warmup=warmup)
    diff = _max_diff(
        grouped_feature,
        last["grouped"],
        last["serial"],
        # LeRobot's prefixes (SmolVLA, π0.5) pad their prompts on the right.
        right_padded=_lerobot_prefix(base),
    )
    cell: dict[str, Any] = {
        "tenants": num_tenants,
        "batch": batch,
        "serial_s": serial_s,
        "grouped_s": grouped_s,
        "speedup": serial_s / grouped_s if grouped_s > 0 else float("inf"),
        "canonicalize_serial_s": canon_serial,
        "canonicalize_grouped_s": canon_grouped,
        "max_abs_diff": diff,
    }
    if flops is not None and peak_gflops is not None:
        cell["roofline"] = roofline(flops, serial_s, grouped_s, peak_gflops)
    return cell


def measure_breakdown(
    base: ResidentBaseModel, num_tenants: int, batch: int, *, repeats: int, warmup: int
) -> dict[str, Any]:
    """Base forward (serial and grouped) vs tenant action-module forward (Figure 11).

    The action-module time is the training forward (loss, no backward) of every
    tenant's head on its slice of the grouped output, summed over tenants.
    """
    groups = tenant_groups(base, num_tenants, batch, seed=7)
    device = base.device
    serial_features = [base.canonicalize([g]) for g in groups]
    grouped_feature = base.canonicalize(groups)
    out = base.encode(grouped_feature)
    result: dict[str, Any] = {
        "tenants": num_tenants,
        "batch": batch,
        "base_forward_serial_s": _median_time(
            lambda: _encode_all(base, serial_features), device, repeats, warmup
        ),
        "base_forward_grouped_s": _median_time(
            lambda: base.encode(grouped_feature), device, repeats, warmup
        ),
        "action_module_forward_s": {},
        "action_module_params": {},
    }
    heads: dict[str, PolicyConfig] = {
        "oft": OFTHeadConfig(),
        "flow_matching": FlowMatchingHeadConfig(),
    }
    if base.extension(SmolVLAResident) is not None:
        heads["smolvla_expert"] = SmolVLAExpertConfig()
    if base.extension(Pi05Checkpoint) is not None:
        heads = {"pi05_expert": Pi05ExpertConfig()}
    for name, head in heads.items():
        slots = [
            TenantSlot(tid, schema, base, head, seed=i) for i, (tid, schema, _) in enumerate(groups)
        ]
        inputs = []
        for slot, (tid, _, obs) in zip(slots, groups, strict=True):
            entry = grouped_feature.slice_of(tid)
            assert obs.actions is not None
            inputs.append(
                (
                    slot,
                    out.rows(entry.start, entry.stop),
                    torch.from_numpy(obs.state).to(device),
                    torch.from_numpy(obs.actions).to(device),
                )
            )

        def heads_forward(inputs: list[Any] = inputs) -> None:
            for slot, feats, state, actions in inputs:
                slot.loss(feats, state, actions)

        result["action_module_forward_s"][name] = _median_time(
            heads_forward, device, repeats, warmup
        )
        result["action_module_params"][name] = sum(p.numel() for p in slots[0].parameters())
    return result


def _build(arch: str, tmp: Path, size: str) -> Path:
    """The bench's model: a tiny/small VLM, a real-size one (``size="real"``, built in a
    child process), or (``smolvla``) a tiny LeRobot SmolVLA with two cameras, built by
    the real lerobot in its venv, or (``pi05``) a LeRobot π0.5 built by lerobot 0.6.1
    in the reference environment: tiny, or (``size="real"``) its smallest real variant."""
    if arch == PI05:
        from joynexus.interop.tiny_pi import make_tiny_pi

        return make_tiny_pi("pi05", tmp / "pi05", size="real" if size == REAL_SIZE else "tiny")
    if size == REAL_SIZE:
        from joynexus.bench.real_models import build_real_isolated

        return build_real_isolated(arch, tmp / f"real-{arch}")
    if arch == SMOLVLA_ARCH:
        from joynexus.interop.lerobot import make_tiny_lerobot

        out = tmp / "smolvla"
        make_tiny_lerobot(arch, out, cameras=["top", "wrist"])
        return out
    return make_tiny(arch, tmp, size=size)


def run_group_batching(
    *,
    arch: str = "qwen2_5_vl",
    size: str = "tiny",
    tenants: Sequence[int] = (2, 4, 6, 8),
    batches: Sequence[int] = (1, 2, 4, 8),
    device: str = "cpu",
    repeats: int = 5,
    warmup: int = 2,
    breakdown: tuple[int, int] | None = (8, 4),
    threads: int | None = None,
    model_dir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the benchmark and return its JSON-ready results.

    Args:
        arch, size: Which tiny/small model to build (``joynexus models make-tiny``), or
            ``size="real"``: ``arch`` ``smolvla``, ``qwen2_5_vl`` or ``pi05`` at real size.
        tenants, batches: The grid (Figure 10).
        device: ``cpu`` (fp32) or ``cuda`` (bf16).
        repeats, warmup: Timed and untimed runs per measurement; the median is kept.
        breakdown: ``(tenants, batch)`` of the Figure 11 breakdown, or ``None``.
        threads: ``torch.set_num_threads`` for the run (default: leave as is).
        model_dir: Reuse an already built model directory instead of building one.
        progress: Called with a short line before each measurement.

    Raises:
        ValueError: an empty grid or non-positive sizes.
    """
    if not tenants or not batches or min(*tenants, *batches) < 1 or repeats < 1 or warmup < 0:
        raise ValueError(
            "tenants and batches need positive entries, repeats >= 1 and warmup >= 0; got "
            f"tenants={list(tenants)}, batches={list(batches)}, repeats={repeats}, "
            f"warmup={warmup}"
        )
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory(prefix="joynexus-bench-") as tmp:
            if progress is not None and model_dir is None:
                progress(f"building the {size} {arch} model")
            path = Path(model_dir) if model_dir is not None else _build(arch, Path(tmp), size)
            rss_before = rss_mb()
            load_start = os.getloadavg()[0]
            base = ResidentBaseModel.from_pretrained(str(path), device=device)
            # Safetensors weights are memory-mapped and paged in on first use: touch them,
            # so the RSS after loading is the resident backbone and no timed forward
            # pays the page faults.
            with torch.no_grad():
                for p in base.model.parameters():
                    p.sum()
            rss_loaded = rss_mb()
            if progress is not None:
                progress("the device's peak matrix-product rate at the model's widths")
            peak = peak_gemm_gflops(model_widths(base.model), device=base.device, dtype=base.dtype)
            grid = []
            with PeakRss(base.device) as peak_rss:
                for t in tenants:
                    for b in batches:
                        if progress is not None:
                            progress(f"{t} tenants x batch {b}")
                        grid.append(
                            measure_cell(
                                base, t, b, repeats=repeats, warmup=warmup, peak_gflops=peak
                            )
                        )
            result: dict[str, Any] = {
                "config": {
                    "arch": arch,
                    "size": size,
                    "device": str(base.device),
                    "dtype": str(base.dtype).removeprefix("torch."),
                    "threads": torch.get_num_threads(),
                    "repeats": repeats,
                    "warmup": warmup,
                    "base_parameters": sum(p.numel() for p in base.model.parameters()),
                    "canonical_image_size": base.canonical_image_size,
                    # How busy the machine was (other processes' load skews the timings).
                    "cpu_count": os.cpu_count(),
                    "load_avg_1m_at_start": load_start,
                    "load_avg_1m_at_end": os.getloadavg()[0],
                    "peak_gemm_gflops_per_s": peak,
                },
                "grid": grid,
                "breakdown": None,
                "max_abs_diff": max(cell["max_abs_diff"] for cell in grid),
                "memory": {
                    "rss_before_load_mb": rss_before,
                    "rss_after_load_mb": rss_loaded,
                    "rss_after_forwards_mb": rss_mb(),
                    "rss_backbone_mb": rss_loaded - rss_before,
                    "parameter_storage_mb": sum(
                        p.numel() * p.element_size() for p in base.model.parameters()
                    )
                    / 2**20,
                    **peak_rss.as_dict(),
                },
            }
            sidecar = path / "joynexus.json"
            if size == REAL_SIZE and arch == PI05:
                result["config"]["real"] = {"arch": PI05, "follows": PI05_REAL}
            elif size == REAL_SIZE and sidecar.is_file():
                result["config"]["real"] = json.loads(sidecar.read_text()).get("real")
            if breakdown is not None:
                if progress is not None:
                    progress(f"breakdown at {breakdown[0]} tenants x batch {breakdown[1]}")
                result["breakdown"] = measure_breakdown(
                    base, breakdown[0], breakdown[1], repeats=repeats, warmup=warmup
                )
            return result
    finally:
        torch.set_num_threads(previous_threads)


def print_report(result: dict[str, Any], console: Console) -> None:
    """Rich tables: the speedup grid (Figure 10) and the breakdown (Figure 11)."""
    cfg = result["config"]
    grid = result["grid"]
    tenants = sorted({c["tenants"] for c in grid})
    batches = sorted({c["batch"] for c in grid})
    cells = {(c["tenants"], c["batch"]): c for c in grid}
    title = f"{cfg['arch']} {cfg['size']}, {cfg['device']} {cfg['dtype']}, {cfg['threads']} threads"
    speed = Table(title=f"Group batching speedup, shared forward ({title})")
    times = Table(title="Shared forward time, serial / grouped (ms)")
    for table in (speed, times):
        table.add_column("tenants \\ batch", justify="right")
        for b in batches:
            table.add_column(f"b={b}", justify="right")
    for t in tenants:
        speed_row, time_row = [str(t)], [str(t)]
        for b in batches:
            c = cells.get((t, b))
            speed_row.append("-" if c is None else f"{c['speedup']:.2f}x")
            time_row.append(
                "-" if c is None else f"{c['serial_s'] * 1e3:.1f} / {c['grouped_s'] * 1e3:.1f}"
            )
        speed.add_row(*speed_row)
        times.add_row(*time_row)
    console.print(speed)
    console.print(times)
    console.print(f"max |grouped - serial| feature diff: {result['max_abs_diff']:.2e}")
    for c in grid:
        roof = c.get("roofline")
        if roof is not None:
            console.print(
                f"{c['tenants']} x {c['batch']}: serial ran {roof['serial_gflops_per_s']:.1f} "
                f"GFLOP/s, grouped {roof['grouped_gflops_per_s']:.1f}; the device's peak "
                f"{roof['peak_gemm_gflops_per_s']:.1f} allows at most "
                f"{roof['speedup_ceiling']:.2f}x"
            )
    if cfg.get("load_avg_1m_at_start") is not None:
        console.print(
            f"load average {cfg['load_avg_1m_at_start']:.2f} at start, "
            f"{cfg['load_avg_1m_at_end']:.2f} at end, {cfg['cpu_count']} CPUs"
        )
    mem = result.get("memory")
    if mem:
        console.print(
            f"memory (RSS): backbone loaded +{mem['rss_backbone_mb']:.0f} MiB "
            f"({mem['parameter_storage_mb']:.0f} MiB of parameters), peak over the forwards "
            f"{mem['rss_peak_mb']:.0f} MiB"
        )
    bd = result.get("breakdown")
    if bd:
        t2 = Table(title=f"Forward breakdown at {bd['tenants']} tenants x batch {bd['batch']}")
        t2.add_column("component")
        t2.add_column("time (ms)", justify="right")
        t2.add_row("base forward, serial", f"{bd['base_forward_serial_s'] * 1e3:.2f}")
        t2.add_row("base forward, grouped", f"{bd['base_forward_grouped_s'] * 1e3:.2f}")
        for name, secs in bd["action_module_forward_s"].items():
            params = bd["action_module_params"][name]
            t2.add_row(f"action modules: {name} ({params:,} params each)", f"{secs * 1e3:.2f}")
        console.print(t2)
