"""Scheduling-policy ablations: the same experiment with one knob changed at a time.

Each variant is a partial override of the scenario (nested mappings merge), run
through :func:`~joynexus.sim.experiment.run_experiment` exactly like the base, so
its effect on utilization and on the isolated ÷ multi-tenant GPU-time ratio is
measured, not assumed. The isolated baseline is replayed for each variant's own
matched work, so ratios compare like with like within a row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from joynexus.sim.experiment import run_experiment, summarize
from joynexus.sim.scenario import Scenario, scenario_from_dict


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    description: str
    override: Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    keys = path.split(".")

    def apply(data: dict[str, Any]) -> None:
        node = data
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return apply


def _each(collection: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(data: dict[str, Any]) -> None:
        for item in data[collection]:
            item[key] = value

    return apply


def _no_sft(data: dict[str, Any]) -> None:
    data["sft_tenants"] = []


VARIANTS: tuple[Variant, ...] = (
    Variant("base", "the scenario as given", lambda _d: None),
    Variant(
        "fifo-actor",
        "no RL priority: the actor leases ready jobs FIFO across RL and SFT",
        _set("scheduler.rl_priority", 0),
    ),
    Variant("no-sft-backfill", "no SFT tenant filling actor idle time", _no_sft),
    Variant(
        "sync-rl",
        "one outstanding training job per RL tenant (rollout waits for its update)",
        _set("scheduler.rl_max_in_flight", 1),
    ),
    Variant("inference-T=0", "no batching wait (T = 0)", _set("inference.max_wait_s", 0.0)),
    Variant(
        "inference-T=0.2s", "longer batching wait (T = 0.2 s)", _set("inference.max_wait_s", 0.2)
    ),
    Variant(
        "staleness-0", "strict on-policy (staleness bound 0)", _set("scheduler.staleness_bound", 0)
    ),
    Variant(
        "no-pool-contention",
        "environment pools do not slow each other",
        _each("env_pools", "contention", 0.0),
    ),
)


def variant_scenario(base: Scenario, variant: Variant) -> Scenario:
    """``base`` with ``variant``'s override applied (validated)."""
    data = base.model_dump(mode="json")
    variant.override(data)
    return scenario_from_dict(data, origin=f"variant {variant.name}")


def run_ablations(
    base: Scenario,
    variants: tuple[Variant, ...] = VARIANTS,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per variant with the headline numbers of its experiment."""
    rows: list[dict[str, Any]] = []
    for v in variants:
        if progress is not None:
            progress(f"ablation {v.name}")
        s = summarize(run_experiment(variant_scenario(base, v)))
        mt, iso = s["multi_tenant"], s["isolated"]
        rows.append(
            {
                "variant": v.name,
                "description": v.description,
                "multi_tenant_training_utilization": mt["training_utilization"],
                "multi_tenant_inference_utilization": mt["inference_utilization"],
                "isolated_training_utilization": iso["training_utilization"],
                "isolated_inference_utilization": iso["inference_utilization"],
                "device_time_ratio": s["device_time_ratio"],
                "matched_updates": mt["matched_updates"],
                "rl_updates": sum(t["matched_updates"] for t in s["tenants"] if t["kind"] == "rl"),
                "drops": mt["drops"],
                "mean_inference_batch_samples": mt["mean_inference_batch_samples"],
            }
        )
    return rows


def ablation_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Scheduling-policy ablations (one knob changed per row; simulated)")
    for name in (
        "variant",
        "train util MT",
        "infer util MT",
        "GPU-time ratio",
        "RL updates",
        "all updates",
        "drops",
        "mean infer batch",
    ):
        t.add_column(name, justify="left" if name == "variant" else "right")
    for r in rows:
        t.add_row(
            r["variant"],
            f"{100 * r['multi_tenant_training_utilization']:.1f}%",
            f"{100 * r['multi_tenant_inference_utilization']:.1f}%",
            f"{r['device_time_ratio']:.2f}×",
            str(r["rl_updates"]),
            str(r["matched_updates"]),
            str(r["drops"]),
            f"{r['mean_inference_batch_samples']:.0f}",
        )
    return t
