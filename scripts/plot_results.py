"""Plots for docs/RESULTS.md from the JSON files the commands write.

Usage::

    .venv/bin/python scripts/plot_results.py simulate docs/results/simulate-paper-5.1.json \
        docs/results/simulate-paper-5.1.png
    .venv/bin/python scripts/plot_results.py ablations docs/results/simulate-ablations.json \
        docs/results/simulate-ablations.png
    .venv/bin/python scripts/plot_results.py group-batching \
        docs/results/group-batching-tiny.json docs/results/group-batching-tiny.png

``simulate``: the multi-tenant utilization timeline against the isolated means (Table 1)
and the GPU time of both executions (Figure 9). ``ablations``: GPU-time ratio and
training utilization per scheduling variant. ``group-batching``: the speedup grid
(Figure 10) and the forward-stage breakdown (Figure 11).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_simulate(doc: dict[str, Any], out: Path) -> None:
    mt, iso = doc["multi_tenant"], doc["isolated"]
    tl = doc["timeline"]
    bin_min = tl["bin_s"] / 60.0
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 1]})
    for service, color in (("training", "tab:blue"), ("inference", "tab:orange")):
        ys = tl["multi_tenant"][service]
        ax.plot(
            [bin_min * (i + 0.5) for i in range(len(ys))], ys, color=color, label=f"{service} MT"
        )
        ax.axhline(
            iso[f"{service}_utilization"],
            color=color,
            ls="--",
            lw=1,
            label=f"{service} isolated mean",
        )
    ax.set_ylim(0, 1)
    ax.set_xlabel("minutes")
    ax.set_ylabel("utilization")
    ax.set_title(f"{doc['scenario']['name']}: model-service utilization (simulated)")
    ax.legend(fontsize=7, ncol=2)
    hours = [iso["gpu_time_s"] / 3600, mt["gpu_time_s"] / 3600]
    bx.bar(["isolated", "multi-tenant"], hours, color=["grey", "tab:green"])
    bx.set_ylabel("GPU-hours")
    bx.set_title(f"GPU time: {doc['device_time_ratio']:.2f}x")
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def plot_ablations(doc: dict[str, Any], out: Path) -> None:
    rows = doc["ablations"]
    names = [r["variant"] for r in rows]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.6))
    ax.barh(names, [r["device_time_ratio"] for r in rows], color="tab:green")
    ax.set_xlabel("GPU-time ratio isolated / multi-tenant")
    ax.invert_yaxis()
    bx.barh(names, [r["multi_tenant_training_utilization"] for r in rows], color="tab:blue")
    bx.set_xlabel("multi-tenant training utilization")
    bx.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def plot_group_batching(doc: dict[str, Any], out: Path) -> None:
    cells = doc["grid"]
    tenants = sorted({c["tenants"] for c in cells})
    batches = sorted({c["batch"] for c in cells})
    grid = [[0.0] * len(batches) for _ in tenants]
    for c in cells:
        grid[tenants.index(c["tenants"])][batches.index(c["batch"])] = c["speedup"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.6))
    im = ax.imshow(grid, cmap="viridis", origin="lower")
    for i in range(len(tenants)):
        for j in range(len(batches)):
            ax.text(j, i, f"{grid[i][j]:.2f}x", ha="center", va="center", color="white", fontsize=8)
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_yticks(range(len(tenants)), [str(t) for t in tenants])
    ax.set_xlabel("local batch size")
    ax.set_ylabel("tenants")
    ax.set_title("grouped / serial shared-forward speedup")
    fig.colorbar(im, ax=ax)
    bd = doc.get("breakdown") or {}
    labels = ["base forward, serial", "base forward, grouped"]
    values = [bd.get("base_forward_serial_s", 0.0), bd.get("base_forward_grouped_s", 0.0)]
    for name, secs in (bd.get("action_module_forward_s") or {}).items():
        labels.append(f"{name} head x {bd.get('tenants')} tenants")
        values.append(secs)
    bx.barh(labels, [v * 1000 for v in values], color="tab:purple")
    bx.invert_yaxis()
    bx.set_xlabel("ms")
    bx.set_title(f"breakdown: {bd.get('tenants')} tenants x batch {bd.get('batch')}")
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def main() -> None:
    kind, src, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    doc = json.loads(src.read_text())
    {"simulate": plot_simulate, "ablations": plot_ablations, "group-batching": plot_group_batching}[
        kind
    ](doc, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
