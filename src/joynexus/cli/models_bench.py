"""``joynexus bench figure12``, ``lora``, ``front-channel``,
``canonicalize``, ``idle-wake``, ``backbone-lock`` and ``forward-split``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from joynexus.cli.app import bench_app

console = Console()

#: The options most model benches take, declared once.
SizeOption = Annotated[str, typer.Option("--size", help="tiny | small")]
JsonOption = Annotated[
    Path | None, typer.Option("--json", help="Also write the results as JSON here.")
]


def _progress(line: str) -> None:
    """A bench's progress line, dimmed."""
    console.print(f"[dim]{line}[/dim]")


def _check_model_options(arch: str, size: str, device: str) -> None:
    """The --arch / --size / --device options every model bench takes."""
    from joynexus.models.tiny import ARCHES, SIZES

    if arch not in ARCHES:
        raise typer.BadParameter(f"must be one of {', '.join(ARCHES)}", param_hint="--arch")
    if size not in SIZES:
        raise typer.BadParameter(f"must be one of {', '.join(SIZES)}", param_hint="--size")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise typer.BadParameter("must be cpu, cuda or cuda:N", param_hint="--device")


def _write_json(result: dict[str, Any], json_path: Path | None) -> None:
    """Also write a bench's results as JSON (``--json``)."""
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2, sort_keys=True))
        console.print(f"wrote {json_path}")


def _int_list(value: str, option: str) -> list[int]:
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        items = []
    if not items or min(items) < 1:
        raise typer.BadParameter(
            f"expected comma-separated positive integers, e.g. 2,4,8; got {value!r}",
            param_hint=option,
        )
    return items


@bench_app.command("figure12")
def bench_figure12(
    out: Annotated[Path, typer.Option("--out", help="PNG to write (JSON goes next to it).")] = Path(
        "figure12.png"
    ),
    head: Annotated[
        str | None,
        typer.Option(
            "--head",
            help="oft | flow_matching | pi0_expert (default: the most specific head the "
            "base hosts: pi0_expert on --arch pi0, else flow_matching)",
        ),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Training steps.")] = 50,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Samples per tenant.")] = 2,
    size: SizeOption = "tiny",
    arch: Annotated[
        str, typer.Option("--arch", help="qwen2_5_vl | qwen3_vl | paligemma | smolvlm | pi0")
    ] = "qwen2_5_vl",
) -> None:
    """Figure 12: per-tenant loss curves, grouped vs serial execution, from one start."""
    import tempfile

    import torch

    from joynexus.bench.figure12 import HEADS, TENANTS, run_figure12, write_figure12
    from joynexus.errors import SpecError
    from joynexus.models.backbone import ResidentBaseModel
    from joynexus.models.tiny import make_tiny

    _check_model_options(arch, size, "cpu")
    if head is not None and head not in HEADS:
        raise typer.BadParameter(f"must be one of {', '.join(HEADS)}", param_hint="--head")
    # Tiny matmuls: extra intra-op threads only contend on a small machine.
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny(arch, Path(tmp) / "m", size=size, seed=0)
        base = ResidentBaseModel.from_pretrained(str(model_dir))
        # Each family says itself whether this base hosts it (a checkpoint's own expert
        # needs that checkpoint); HEADS runs from the most general to the most specific.
        refusals: dict[str, str] = {}
        for name, config in HEADS.items():
            try:
                for _, schema in TENANTS:
                    config.check_base(base, schema)
            except SpecError as exc:
                refusals[name] = str(exc)
        hosted = [name for name in HEADS if name not in refusals]
        head = hosted[-1] if head is None else head
        if head in refusals:
            raise typer.BadParameter(refusals[head], param_hint="--head")
        run = run_figure12(base, HEADS[head], steps=steps, batch=batch)
    path = write_figure12(run, out, head=head, batch=batch, size=size)
    console.print(
        f"wrote {out} and {path}: max relative loss difference "
        f"{run.max_relative_difference:.2e}; grouped {run.grouped_s:.2f} s vs serial "
        f"{run.serial_s:.2f} s for {steps} steps"
    )


@bench_app.command("lora")
def bench_lora(
    tenants: Annotated[int, typer.Option("--tenants", min=1, help="LoRA tenants.")] = 8,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Rows per tenant.")] = 1,
    ranks: Annotated[str, typer.Option("--ranks", help="Adapter ranks.")] = "8,32",
    arch: Annotated[
        str, typer.Option("--arch", help="qwen2_5_vl | qwen3_vl | paligemma | smolvlm | pi0")
    ] = "qwen2_5_vl",
    size: SizeOption = "tiny",
    device: Annotated[str, typer.Option("--device", help="cpu (fp32) | cuda (bf16)")] = "cpu",
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Timed runs (median).")] = 9,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs first.")] = 3,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="torch intra-op threads.")
    ] = None,
    peft: Annotated[
        bool, typer.Option("--peft/--no-peft", help="Also time peft's mixed batch.")
    ] = True,
    budget_mb: Annotated[
        float, typer.Option("--budget-mb", min=1, help="Tenant memory budget (capacity).")
    ] = 1024.0,
    json_path: JsonOption = None,
    vision: Annotated[
        bool,
        typer.Option(
            "--vision/--no-vision",
            help="Adapters also on the vision tower and its projection (no peft reference).",
        ),
    ] = False,
    retain_heap: Annotated[
        bool,
        typer.Option(
            "--retain-heap/--no-retain-heap",
            help="Keep freed host memory in the heap (glibc mallopt): no page faults "
            "for the grouped step's large blocks.",
        ),
    ] = False,
) -> None:
    """LoRA tenants: mixed-adapter grouped vs serial forward and forward+backward."""
    from joynexus.bench.lora import print_report, run_lora_bench
    from joynexus.utils.heap import retain_freed_memory

    _check_model_options(arch, size, device)
    if retain_heap and not retain_freed_memory():
        console.print("--retain-heap: this C library has no mallopt; timing as is")
    result = run_lora_bench(
        arch=arch,
        size=size,
        tenants=tenants,
        batch=batch,
        ranks=_int_list(ranks, "--ranks"),
        device=device,
        repeats=repeats,
        warmup=warmup,
        threads=threads,
        peft=peft,
        budget_bytes=int(budget_mb * 1024 * 1024),
        vision=vision,
    )
    result["retain_heap"] = retain_heap
    print_report(result, console)
    _write_json(result, json_path)


@bench_app.command("pi-parity")
def bench_pi_parity(
    family: Annotated[str, typer.Option("--family", help="pi05 | pi0")] = "pi05",
    size: Annotated[
        str,
        typer.Option(
            "--size",
            help="real: lerobot's smallest π variant (gemma_300m, ~1.9 B parameters, "
            "needs ~16 GiB free); tiny: the tests' size.",
        ),
    ] = "real",
    rows: Annotated[int, typer.Option("--rows", min=1, max=2, help="Observations.")] = 2,
    json_path: JsonOption = None,
) -> None:
    """A LeRobot π checkpoint both ways against lerobot 0.6.1 (the reference
    environment): its actions in JoyNexus, a tenant's export in lerobot."""
    from joynexus.bench.pi_parity import parity
    from joynexus.interop.tiny_pi import PI_SIZES

    if family not in ("pi05", "pi0") or size not in PI_SIZES:
        raise typer.BadParameter(
            f"--family pi05|pi0 and --size {'|'.join(PI_SIZES)}, got {family!r} / {size!r}"
        )
    result = parity(family=family, size=size, rows=rows)
    console.print_json(data=result)
    _write_json(result, json_path)


@bench_app.command("front-channel")
def bench_front_channel(
    messages: Annotated[
        int, typer.Option("--messages", min=10, help="Observations per channel and size.")
    ] = 2000,
    json_path: JsonOption = None,
) -> None:
    """How a front process hands a decoded observation to the model process: pickled in
    the frame vs shared-memory slots (round-trip microseconds)."""
    from joynexus.bench.front_channel import print_report, run_front_channel_bench

    result = run_front_channel_bench(messages=messages, progress=_progress)
    print_report(result, console)
    _write_json(result, json_path)


@bench_app.command("canonicalize")
def bench_canonicalize(
    size: SizeOption = "tiny",
    tenants: Annotated[int, typer.Option("--tenants", min=1, help="One-row tenants.")] = 8,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Timed runs (median).")] = 20,
    arch: Annotated[
        list[str] | None,
        typer.Option("--arch", help="Architectures (repeatable; default: all five)."),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="cpu (fp32) | cuda (bf16)")] = "cpu",
    json_path: JsonOption = None,
) -> None:
    """Tensor canonicalization vs the Hugging Face processor, per architecture."""
    from joynexus.bench.canonicalize import print_report, run_canonicalize_bench
    from joynexus.models.tiny import ARCHES

    arches = arch or list(ARCHES)
    for a in arches:
        _check_model_options(a, size, device)
    result = run_canonicalize_bench(
        arches=arches,
        size=size,
        tenants=tenants,
        repeats=repeats,
        device=device,
        progress=_progress,
    )
    print_report(result, console)
    _write_json(result, json_path)


@bench_app.command("idle-wake")
def bench_idle_wake(
    size: SizeOption = "small",
    pauses: Annotated[
        str, typer.Option("--pauses-ms", help="Idle pauses before a timed call, comma-separated.")
    ] = "1,10,50",
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, help="Timed calls per stage and pause (median).")
    ] = 40,
    json_path: JsonOption = None,
) -> None:
    """A lone request's decoding and canonicalization, back to back and after idle pauses."""
    from joynexus.bench.idle_wake import print_report, run_idle_wake_bench

    _check_model_options("qwen2_5_vl", size, "cpu")
    try:
        pauses_ms = [float(v) for v in pauses.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(
            "expected numbers such as 1,10,50", param_hint="--pauses-ms"
        ) from None
    if not all(0 <= p <= 10_000 for p in pauses_ms):  # NaN fails this too
        raise typer.BadParameter("pauses must lie within 0..10000 ms", param_hint="--pauses-ms")
    result = run_idle_wake_bench(
        size=size,
        pauses_ms=pauses_ms,
        repeats=repeats,
        progress=_progress,
    )
    print_report(result, console)
    _write_json(result, json_path)


@bench_app.command("backbone-lock")
def bench_backbone_lock(
    size: SizeOption = "tiny",
    clients: Annotated[
        int, typer.Option("--clients", min=1, help="Closed-loop predict clients.")
    ] = 4,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Rows of each SFT step.")] = 8,
    duration_s: Annotated[
        float, typer.Option("--duration-s", min=0.1, help="Timed mixture per side.")
    ] = 10.0,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="torch intra-op threads.")
    ] = None,
    json_path: JsonOption = None,
) -> None:
    """Training and inference on one shared backbone (one lock) vs an inference copy."""
    from joynexus.bench.backbone_lock import print_report, run_backbone_lock_bench
    from joynexus.models.tiny import SIZES

    if size not in SIZES:
        raise typer.BadParameter(f"must be one of {', '.join(SIZES)}", param_hint="--size")
    result = run_backbone_lock_bench(
        size=size,
        clients=clients,
        batch=batch,
        duration_s=duration_s,
        threads=threads,
        progress=_progress,
    )
    print_report(result, console)
    _write_json(result, json_path)


@bench_app.command("forward-split")
def bench_forward_split(
    size: SizeOption = "small",
    rows: Annotated[
        str, typer.Option("--rows", help="Rows per batch (one per tenant), comma-separated.")
    ] = "1,4,16,33",
    busy: Annotated[
        str, typer.Option("--busy", help="Spinning processes beside the bench, comma-separated.")
    ] = "0,1",
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, help="Timed forwards per way, rows and load.")
    ] = 12,
    json_path: JsonOption = None,
) -> None:
    """A CPU forward serial, split, by the size rule and by measurement, beside busy cores."""
    from joynexus.bench.forward_split import print_report, run_forward_split_bench

    _check_model_options("qwen2_5_vl", size, "cpu")
    try:
        loads = [int(v) for v in busy.split(",") if v.strip()]
    except ValueError:
        loads = [-1]
    if not loads or min(loads) < 0:
        raise typer.BadParameter("expected counts ≥ 0 such as 0,1", param_hint="--busy")
    result = run_forward_split_bench(
        size=size,
        rows=_int_list(rows, "--rows"),
        busy=loads,
        rounds=rounds,
        progress=_progress,
    )
    print_report(result, console)
    _write_json(result, json_path)
