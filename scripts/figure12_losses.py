"""Figure 12 of the paper: per-tenant loss curves, grouped vs serial execution.

The setup of ``tests/models/test_proof_figure12.py``: four tenants (two with the LIBERO
schema's dims and cameras, two with CALVIN's; small images) train for 50 steps twice from
identical initial states on identical synthetic batches — once with one shared backbone
forward per step (grouped), once with one forward per tenant (serial). This script
records both loss curves per tenant, plots them (``--out`` PNG) and writes them as JSON
next to it.

Usage::

    .venv/bin/python scripts/figure12_losses.py --out docs/results/figure12.png \
        [--head oft|flow_matching] [--steps 50] [--size tiny|small]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.grouped import GroupedExecutor
from joynexus.models.heads import FlowMatchingHeadConfig, OFTHeadConfig
from joynexus.models.schema import CALVIN, LIBERO, CameraSpec, DataSchema
from joynexus.models.slots import OptimizerConfig, TenantSlot
from joynexus.models.tiny import make_tiny

LIBERO_SMALL = LIBERO.model_copy(
    update={
        "cameras": {
            "image": CameraSpec(height=32, width=32),
            "wrist_image": CameraSpec(height=32, width=32),
        }
    }
)
CALVIN_SMALL = CALVIN.model_copy(
    update={
        "cameras": {
            "rgb_static": CameraSpec(height=40, width=40),
            "rgb_gripper": CameraSpec(height=16, width=16),
        }
    }
)
TENANTS: list[tuple[str, DataSchema]] = [
    ("libero-a", LIBERO_SMALL),
    ("libero-b", LIBERO_SMALL),
    ("calvin-a", CALVIN_SMALL),
    ("calvin-b", CALVIN_SMALL),
]


def _executor(
    base: ResidentBaseModel, head: OFTHeadConfig | FlowMatchingHeadConfig
) -> GroupedExecutor:
    slots = [
        TenantSlot(tid, schema, base, head, seed=i, optimizer=OptimizerConfig(lr=1e-3))
        for i, (tid, schema) in enumerate(TENANTS)
    ]
    return GroupedExecutor(base, slots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("figure12.png"))
    parser.add_argument("--head", choices=["oft", "flow_matching"], default="flow_matching")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", choices=["tiny", "small"], default="tiny")
    args = parser.parse_args()
    torch.set_num_threads(1)
    head: OFTHeadConfig | FlowMatchingHeadConfig = (
        OFTHeadConfig(hidden_dim=64)
        if args.head == "oft"
        else FlowMatchingHeadConfig(hidden_dim=32, num_layers=2, num_heads=4)
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny("qwen2_5_vl", Path(tmp) / "m", size=args.size, seed=0)
        base = ResidentBaseModel.from_pretrained(str(model_dir))
        grouped, serial = _executor(base, head), _executor(base, head)
        curves: dict[str, dict[str, list[float]]] = {
            tid: {"grouped": [], "serial": []} for tid, _ in TENANTS
        }
        t_grouped = t_serial = 0.0
        for step in range(args.steps):
            batches = {
                tid: ObservationBatch.synthetic(schema, args.batch, seed=1000 * i + step)
                for i, (tid, schema) in enumerate(TENANTS)
            }
            t0 = time.perf_counter()
            g = grouped.train_step(batches)
            t1 = time.perf_counter()
            s = serial.serial_train_step(batches)
            t2 = time.perf_counter()
            t_grouped += t1 - t0
            t_serial += t2 - t1
            for tid in batches:
                curves[tid]["grouped"].append(float(g[tid].loss))
                curves[tid]["serial"].append(float(s[tid].loss))
    max_rel = max(
        abs(a - b) / max(abs(b), 1e-12)
        for c in curves.values()
        for a, b in zip(c["grouped"], c["serial"], strict=True)
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(13, 3.2))
    for ax, (tid, c) in zip(axes, curves.items(), strict=True):
        steps = range(1, args.steps + 1)
        ax.plot(steps, c["serial"], lw=2.5, alpha=0.5, label="serial")
        ax.plot(steps, c["grouped"], lw=1, ls="--", color="black", label="grouped")
        ax.set_title(tid)
        ax.set_xlabel("step")
    axes[0].set_ylabel(f"{args.head} loss")
    axes[0].legend()
    fig.suptitle(f"grouped vs serial training, max relative loss difference {max_rel:.1e}")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=80)
    doc = {
        "head": args.head,
        "steps": args.steps,
        "batch": args.batch,
        "size": args.size,
        "max_relative_loss_difference": max_rel,
        "grouped_s": round(t_grouped, 3),
        "serial_s": round(t_serial, 3),
        "curves": curves,
    }
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    print(
        f"wrote {args.out}: max relative loss difference {max_rel:.2e}; "
        f"grouped {t_grouped:.2f} s vs serial {t_serial:.2f} s for {args.steps} steps"
    )


if __name__ == "__main__":
    main()
