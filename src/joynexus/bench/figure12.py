"""``joynexus bench figure12``: the paper's Figure 12, grouped vs serial per-tenant losses.

Four tenants (two with the LIBERO schema's dims and cameras, two with CALVIN's; small
images) train twice from identical initial states on identical synthetic batches: once
with ONE shared backbone forward per step over all tenants (grouped), once with one
forward per tenant (serial). The per-step losses of each tenant are recorded for both.
The same setup backs the exactness test ``tests/models/test_proof_figure12.py``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.policies import (
    FlowMatchingHeadConfig,
    OFTHeadConfig,
    Pi0ExpertConfig,
    PolicyConfig,
)
from joynexus.models.schema import CALVIN, LIBERO, CameraSpec, DataSchema
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot

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
HEADS: dict[str, PolicyConfig] = {
    "oft": OFTHeadConfig(hidden_dim=64),
    "flow_matching": FlowMatchingHeadConfig(hidden_dim=32, num_layers=2, num_heads=4),
    # On a π0 base: each tenant trains its own copy of the checkpoint's action expert.
    "pi0_expert": Pi0ExpertConfig(),
}


def build_executor(base: ResidentBaseModel, head: PolicyConfig) -> GroupedExecutor:
    """The four tenants' slots (seeded by position) over ``base``."""
    return GroupedExecutor(
        base,
        [
            TenantSlot(tid, schema, base, head, seed=i, optimizer=OptimizerConfig(lr=1e-3))
            for i, (tid, schema) in enumerate(TENANTS)
        ],
    )


def step_batches(step: int, batch: int) -> dict[str, ObservationBatch]:
    """Step ``step``'s synthetic batch of every tenant (deterministic)."""
    return {
        tid: ObservationBatch.synthetic(schema, batch, seed=1000 * i + step)
        for i, (tid, schema) in enumerate(TENANTS)
    }


@dataclass
class Figure12Run:
    """Losses per tenant and step, for both executions, and their timings."""

    grouped: GroupedExecutor
    serial: GroupedExecutor
    losses: dict[str, dict[str, list[float]]]  # tenant → {"grouped": [...], "serial": [...]}
    versions: dict[str, list[tuple[int, int]]]  # tenant → (grouped, serial) version per step
    grouped_s: float
    serial_s: float

    @property
    def max_relative_difference(self) -> float:
        return max(
            abs(a - b) / max(abs(b), 1e-12)
            for c in self.losses.values()
            for a, b in zip(c["grouped"], c["serial"], strict=True)
        )


def run_figure12(
    base: ResidentBaseModel,
    head: PolicyConfig,
    *,
    steps: int = 50,
    batch: int = 2,
) -> Figure12Run:
    """Train the four tenants ``steps`` times grouped and serially from the same start."""
    grouped, serial = build_executor(base, head), build_executor(base, head)
    losses: dict[str, dict[str, list[float]]] = {
        t: {"grouped": [], "serial": []} for t, _ in TENANTS
    }
    versions: dict[str, list[tuple[int, int]]] = {t: [] for t, _ in TENANTS}
    grouped_s = serial_s = 0.0
    for step in range(steps):
        batches = step_batches(step, batch)
        t0 = time.perf_counter()
        g = grouped.train_step(batches)
        t1 = time.perf_counter()
        s = serial.serial_train_step(batches)
        t2 = time.perf_counter()
        grouped_s += t1 - t0
        serial_s += t2 - t1
        for tid in batches:
            losses[tid]["grouped"].append(float(g[tid].loss))
            losses[tid]["serial"].append(float(s[tid].loss))
            versions[tid].append((g[tid].policy_version, s[tid].policy_version))
    return Figure12Run(grouped, serial, losses, versions, grouped_s, serial_s)


def write_figure12(run: Figure12Run, out: Path, *, head: str, batch: int, size: str) -> Path:
    """Plot the curves to ``out`` (PNG) and write the numbers next to it as JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    max_rel = run.max_relative_difference
    fig, axes = plt.subplots(1, len(run.losses), figsize=(13, 3.2))
    for ax, (tid, c) in zip(axes, run.losses.items(), strict=True):
        steps = range(1, len(c["serial"]) + 1)
        ax.plot(steps, c["serial"], lw=2.5, alpha=0.5, label="serial")
        ax.plot(steps, c["grouped"], lw=1, ls="--", color="black", label="grouped")
        ax.set_title(tid)
        ax.set_xlabel("step")
    axes[0].set_ylabel(f"{head} loss")
    axes[0].legend()
    fig.suptitle(f"grouped vs serial training, max relative loss difference {max_rel:.1e}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    doc: dict[str, Any] = {
        "head": head,
        "steps": len(next(iter(run.losses.values()))["grouped"]),
        "batch": batch,
        "size": size,
        "max_relative_loss_difference": max_rel,
        "grouped_s": round(run.grouped_s, 3),
        "serial_s": round(run.serial_s, 3),
        "curves": run.losses,
    }
    path = out.with_suffix(".json")
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
