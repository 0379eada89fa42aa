"""The demo's report: Table 1 and Figure 9 of §5.1 on measured traces, and report.json
(its figures: :mod:`joynexus.demo.plots`).

Definitions (all from the traces of :mod:`joynexus.demo.phase`):

* **Window** of a phase: from the moment the first workload's loops start to the
  completion of its last matched update (model loading, the first session's start-up
  and final checkpoints are outside; they are reported in ``wall_s``; the Master
  launches a phase's workloads concurrently, so later sessions may start inside it).
* **Utilization** of a service = its busy seconds inside the window ÷ the window. Busy
  seconds are the measured durations of grouped inference batches and of training
  (optimizer / actor-forward) steps — what the plane's usage meter accumulates.
  The isolated row is the mean over the standalone RL replays, as in Table 1; the
  aggregate over all replays (SFT included) is reported too.
* **Device time**: both phases ran on the same single machine, every service sharing
  it, so a phase's device time is its window × 1 machine, and ``device_time_ratio`` =
  Σ isolated windows ÷ multi-tenant window (same matched work). The paper's accounting
  (multi-tenant 2-2-4 = 8 devices, isolated 1-1-2 = 4 devices) is reported as
  ``device_time_ratio_layout_weighted``; here it is arithmetic on the measured windows,
  not a measurement on 8 devices.

* **Success rate** of a trainable tenant (``report.json``'s ``success_rates``, per
  tenant, and the ``tenant_row`` of its isolated replay): episodes succeeded ÷
  ``eval_episodes`` in its own simulator on fixed evaluation seeds (``eval_first_seed``
  + j, never the demonstration seeds), measured by the Master before the tenant's first
  update and after its last, each with its Wilson 95 % interval
  (``success_rate_ci95_initial`` / ``_final``). It is measured in the isolated replays,
  where the tenant trains alone on its matched updates and both measurements fall
  outside the replay's window (before its loops start, after its last matched update):
  they lengthen the replays' wall time, not their windows. The multi-tenant run
  measures none: there a tenant's "before" would delay its start while the others
  train, and an early "after" would overlap their work, changing what is compared.
  ``joynexus demo --success-episodes 0`` leaves the measurements out.

Which way is good (``report.json``'s ``how_to_read``, the tables' captions and the
closing :func:`verdict` line say it too): a ``device_time_ratio`` above 1 means the
isolated replays needed more device time than the multi-tenant run for the same work,
so sharing saved device time; below 1, sharing cost time. A utilization ``improvement``
above 1 means the shared services were busier under multi-tenancy.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from joynexus.demo.idle import device_idle
from joynexus.demo.phase import PhaseTrace

__all__ = [
    "HOW_TO_READ",
    "LAYOUT_DEVICES_ISOLATED",
    "LAYOUT_DEVICES_MULTI",
    "build_report",
    "device_time_bound",
    "episodes_label",
    "format_success",
    "loss_curve",
    "report_tables",
    "return_curve",
    "success_reading",
    "verdict",
    "write_report",
]

LAYOUT_DEVICES_MULTI = 8  # 2-2-4
LAYOUT_DEVICES_ISOLATED = 4  # 1-1-2
SERVICES = ("training", "inference", "environment")

#: Which way each ratio of the report is good (also written to ``report.json``).
HOW_TO_READ = {
    "device_time_ratio": (
        "isolated / multi-tenant device time for the same matched work: above 1 means "
        "the multi-tenant run needed less device time (sharing saved time; higher is "
        "better), below 1 that it needed more"
    ),
    "device_time_ratio_layout_weighted": (
        "the same ratio with the paper's device counts (1-1-2 isolated, 2-2-4 "
        "multi-tenant): above 1 is better for multi-tenancy"
    ),
    "device_time_bound": (
        "the largest device_time_ratio the isolated replays allow on this machine: their "
        "summed windows / the larger of their summed device-busy and simulator-busy "
        "seconds (a perfect overlap of all replays still needs the busiest resource's "
        "time); efficiency = (ratio - 1) / (bound - 1): 1 reaches the bound, 0 is no gain, "
        "below 0 is a loss"
    ),
    "device_idle": (
        "the multi-tenant window taken apart: device-busy seconds + idle seconds by "
        "cause; window - isolated_device_busy_s (the bound's window when the device "
        "limits it) = stretch_s (the same work kept the device busy longer than in the "
        "replays: contention) + idle_s (see device_idle.png and joynexus.demo.idle)"
    ),
    "improvement": (
        "multi-tenant / isolated utilization of a shared service: above 1 means the "
        "service was busier when shared (higher is better), below 1 that it idled more"
    ),
    "success_rate": (
        "episodes succeeded / eval_episodes on fixed evaluation seeds, before the "
        "tenant's first update (initial) and after its last (final), in its isolated "
        "replay of the matched work; higher is better. [low, high] is the Wilson 95 % "
        "interval: a change whose intervals overlap is not told apart by this many "
        "episodes"
    ),
}


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def loss_curve(records: Sequence[dict[str, Any]]) -> list[float]:
    return [float(r["loss"]) for r in records if r["kind"] == "train" and r.get("loss") is not None]


def return_curve(records: Sequence[dict[str, Any]]) -> list[float]:
    return [
        float(r["mean_return"])
        for r in records
        if r["kind"] == "rollout" and r.get("mean_return") is not None
    ]


def _tenant_row(trace: PhaseTrace, tenant: str) -> dict[str, Any]:
    recs = trace.records.get(tenant, [])
    losses, rets = loss_curve(recs), return_curve(recs)
    done = trace.completed(tenant)
    summ = trace.summary.tenants.get(tenant)
    n = trace.matched.get(tenant, 0)
    finish = done[n - 1].finished_at if 0 < n <= len(done) else None
    return {
        "task": summ.task if summ else None,
        "updates_matched": n,
        "updates_in_window": trace.updates_in_window(tenant),
        "jobs_completed": summ.jobs_completed if summ else 0,
        "jobs_dropped": summ.jobs_dropped if summ else 0,
        "final_version": summ.final_version if summ else None,
        "loss_first": _r(losses[0]) if losses else None,
        "loss_last": _r(losses[-1]) if losses else None,
        "return_first": _r(rets[0]) if rets else None,
        "return_last": _r(rets[-1]) if rets else None,
        "time_to_matched_s": _r(finish - trace.started_at, 2) if finish else None,
        "usage_device_seconds": {
            k: _r(v) for k, v in trace.usage.tenants[tenant].device_seconds.items()
        }
        if tenant in trace.usage.tenants
        else {},
    }


def _ci(ci: tuple[float, float] | None) -> list[float] | None:
    return None if ci is None else [round(ci[0], 4), round(ci[1], 4)]


_SUCCESS_KEYS = (
    "success_rate_initial",
    "success_rate_final",
    "success_rate_ci95_initial",
    "success_rate_ci95_final",
    "eval_episodes",
    "eval_first_seed",
    "success_errors",
)


def _success_row(trace: PhaseTrace, tenant: str) -> dict[str, Any]:
    """The tenant's success rate before and after training, from the run summary
    (all None when it was not measured); a failed measurement is in ``success_errors``."""
    summ = trace.summary.tenants.get(tenant)
    if summ is None:
        return {
            "success_rate_initial": None,
            "success_rate_final": None,
            "success_rate_ci95_initial": None,
            "success_rate_ci95_final": None,
            "eval_episodes": None,
            "eval_first_seed": None,
            "success_errors": [],
        }
    return {
        "success_rate_initial": _r(summ.success_rate_initial),
        "success_rate_final": _r(summ.success_rate_final),
        "success_rate_ci95_initial": _ci(summ.success_rate_ci95_initial),
        "success_rate_ci95_final": _ci(summ.success_rate_ci95),
        "eval_episodes": summ.eval_episodes,
        "eval_first_seed": summ.eval_first_seed,
        "success_errors": [e for e in summ.errors if e.startswith("success_eval")],
    }


def _phase(trace: PhaseTrace) -> dict[str, Any]:
    return {
        "name": trace.name,
        "window_s": _r(trace.window_s, 3),
        "wall_s": _r(trace.wall_s, 2),
        "training_utilization": _r(trace.utilization("training")),
        "inference_utilization": _r(trace.utilization("inference")),
        "environment_busy_s": _r(trace.busy_seconds("environment"), 2),
        "busy_seconds": {s: _r(trace.busy_seconds(s), 3) for s in SERVICES},
        "usage_service_seconds": {k: _r(v, 3) for k, v in trace.usage.service_seconds.items()},
        "inference_lock_wait": _lock_wait(trace),
    }


def _lock_wait(trace: PhaseTrace) -> dict[str, Any]:
    """What sharing the backbone with training cost inference in this phase: the time
    its batches waited for the backbone lock, per batch and against their device time."""
    wait_s, batches = trace.predict_stages.get("lock_wait", (0.0, 0))
    device_s = sum(trace.predict_stages.get(s, (0.0, 0))[0] for s in _DEVICE_STAGES)
    return {
        "batches": batches,
        "wait_s": _r(wait_s, 3),
        "ms_per_batch": _r(wait_s / batches * 1e3, 2) if batches else None,
        "fraction_of_device_s": _r(wait_s / device_s) if device_s > 0 else None,
    }


_DEVICE_STAGES = ("canonicalize", "backbone", "head")


def build_report(
    multi: PhaseTrace,
    isolated: Sequence[PhaseTrace],
    *,
    profile: str,
    reason: str,
    knobs: dict[str, Any],
    rl_tenants: Sequence[str],
    sft_tenant: str,
    eval_tenant: str,
) -> dict[str, Any]:
    """The report document (``report.json``); see the module docstring for definitions."""
    mt = _phase(multi)
    mt["tenants"] = {t: _tenant_row(multi, t) for t in (*rl_tenants, sft_tenant)}
    ev = multi.summary.tenants.get(eval_tenant)
    mt["evaluation"] = {
        "tenant": eval_tenant,
        "success_rate": ev.eval_success_rate if ev else None,
        "runs": [r.model_dump() for r in ev.eval_runs] if ev else [],
    }
    replays = []
    for tr in isolated:
        row = _phase(tr)
        tenant = next(iter(tr.matched))
        row["tenant"] = tenant
        row["tenant_row"] = _tenant_row(tr, tenant) | _success_row(tr, tenant)
        replays.append(row)
    rl_replays = [tr for tr in isolated if next(iter(tr.matched)) in rl_tenants]

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    iso_window = sum(tr.window_s for tr in isolated)
    iso = {
        "training_utilization": _r(mean([tr.utilization("training") for tr in rl_replays])),
        "inference_utilization": _r(mean([tr.utilization("inference") for tr in rl_replays])),
        "aggregate_training_utilization": _r(
            sum(tr.busy_seconds("training") for tr in isolated) / max(iso_window, 1e-9)
        ),
        "aggregate_inference_utilization": _r(
            sum(tr.busy_seconds("inference") for tr in isolated) / max(iso_window, 1e-9)
        ),
        "window_s": _r(iso_window, 3),
        "wall_s": _r(sum(tr.wall_s for tr in isolated), 2),
        "replays": replays,
    }
    ratio = iso_window / multi.window_s
    bound = device_time_bound(isolated, ratio)
    layout = (iso_window * LAYOUT_DEVICES_ISOLATED) / (multi.window_s * LAYOUT_DEVICES_MULTI)

    def gain(key: str) -> float | None:
        a, b = mt.get(key), iso.get(key)
        return _r(a / b, 3) if isinstance(a, float) and isinstance(b, float) and b > 0 else None

    return {
        "profile": profile,
        "env_choice_reason": reason,
        "knobs": knobs,
        "machine": {"cpu_cores": os.cpu_count(), "devices": "one CPU machine, shared by all"},
        "matched_updates": dict(multi.matched),
        "multi_tenant": mt,
        "isolated": iso,
        "improvement": {
            "training_utilization": gain("training_utilization"),
            "inference_utilization": gain("inference_utilization"),
        },
        "device_time": {
            "definition": (
                "window x devices; both phases ran on the same single machine, so "
                "device time = window seconds x 1"
            ),
            "multi_tenant_s": _r(multi.window_s, 2),
            "isolated_s": _r(iso_window, 2),
            "layout_weighted": {
                "definition": (
                    "paper accounting, arithmetic on the measured windows: multi-tenant "
                    f"x {LAYOUT_DEVICES_MULTI} devices (2-2-4), isolated x "
                    f"{LAYOUT_DEVICES_ISOLATED} (1-1-2)"
                ),
                "multi_tenant_device_s": _r(multi.window_s * LAYOUT_DEVICES_MULTI, 2),
                "isolated_device_s": _r(iso_window * LAYOUT_DEVICES_ISOLATED, 2),
            },
        },
        "device_time_ratio": _r(ratio, 3),
        "device_time_ratio_layout_weighted": _r(layout, 3),
        "device_time_bound": bound,
        "device_idle": device_idle(multi, isolated),
        "success_rates": {
            "measured_in": "isolated replays (each tenant alone, its matched updates)",
            "tenants": {
                r["tenant"]: {
                    "task": r["tenant_row"]["task"],
                    "updates": r["tenant_row"]["updates_matched"],
                }
                | {k: v for k, v in r["tenant_row"].items() if k in _SUCCESS_KEYS}
                | {"reading": success_reading(r["tenant_row"])}
                for r in replays
            },
        },
        "how_to_read": dict(HOW_TO_READ),
    }


def device_time_bound(isolated: Sequence[PhaseTrace], ratio: float) -> dict[str, Any]:
    """The largest device-time ratio the isolated replays allow, and how much of the
    possible gain ``ratio`` achieved (see ``HOW_TO_READ["device_time_bound"]``).

    Overlapping every replay perfectly still leaves the busiest resource's seconds: the
    shared device's (training and inference steps) or the simulators' (their steps).
    """
    windows = sum(tr.window_s for tr in isolated)
    device_s = sum(tr.device_busy_seconds() for tr in isolated)
    simulator_s = sum(tr.busy_seconds("environment") for tr in isolated)
    floor = max(device_s, simulator_s)
    limited_by = "device" if device_s >= simulator_s else "simulators"
    bound = windows / floor if floor > 0 else None
    efficiency = (ratio - 1.0) / (bound - 1.0) if bound is not None and bound > 1.0 + 1e-9 else None
    return {
        "bound": _r(bound, 3),
        "efficiency": _r(efficiency, 3),
        "isolated_window_s": _r(windows, 2),
        "isolated_device_busy_s": _r(device_s, 2),
        "isolated_simulator_busy_s": _r(simulator_s, 2),
        "limited_by": limited_by if floor > 0 else None,
    }


def verdict(report: dict[str, Any]) -> str:
    """One sentence on the device-time ratio, saying which way is good."""
    ratio = report.get("device_time_ratio")
    if not isinstance(ratio, int | float):
        return "device time: no ratio (a phase measured no window)"
    if ratio >= 1:
        outcome = (
            f"the isolated replays needed {ratio:.2f}x the multi-tenant run's device time "
            "for the same matched work: sharing saved device time (above 1 is better)"
        )
    else:
        outcome = (
            f"the multi-tenant run needed {1 / ratio:.2f}x the isolated replays' device "
            f"time for the same matched work (ratio {ratio:.2f}; below 1 is worse)"
        )
    bound = report.get("device_time_bound") or {}
    if isinstance(bound.get("bound"), int | float):
        eff = bound.get("efficiency")
        outcome += (
            f"; this machine's bound for these replays is {bound['bound']:.2f}x (limited by "
            f"the {bound['limited_by']})"
            + ("" if eff is None else f", efficiency {eff:.2f} of the possible gain")
        )
    idle = report.get("device_idle") or {}
    if isinstance(idle.get("idle_s"), int | float) and isinstance(
        idle.get("stretch_s"), int | float
    ):
        causes = ", ".join(
            f"{k.replace('_', ' ')} {v:.0f} s" for k, v in idle["idle_by_cause_s"].items()
        )
        outcome += (
            f". Of the multi-tenant window's {idle['window_s']:.0f} s, the replays' device "
            f"work took {idle['isolated_device_busy_s']:.0f} s; the rest is "
            f"{idle['stretch_s']:.0f} s of stretch (the same work, longer on the device) "
            f"and {idle['idle_s']:.0f} s of idle device ({causes})"
        )
    return f"device time: {outcome}"


def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * float(x):.1f}%"


def _num(x: Any, nd: int = 3) -> str:
    return "–" if x is None else f"{float(x):.{nd}f}"


def _rate(rate: Any, ci: Any) -> str:
    if rate is None:
        return "–"
    text = f"{100 * float(rate):.0f} %"
    if ci is not None:
        text += f" [{100 * float(ci[0]):.0f}, {100 * float(ci[1]):.0f}]"
    return text


def format_success(row: dict[str, Any]) -> str:
    """A tenant's success rate before → after with Wilson 95 % intervals in percent,
    e.g. ``0 % [0, 28] → 40 % [17, 69] (10 episodes)``; ``–`` for a rate not measured."""
    before = _rate(row.get("success_rate_initial"), row.get("success_rate_ci95_initial"))
    after = _rate(row.get("success_rate_final"), row.get("success_rate_ci95_final"))
    return f"{before} → {after}" + (f" ({episodes_label(row)})" if row.get("eval_episodes") else "")


def success_reading(row: dict[str, Any]) -> str:
    """What a tenant's before → after says, in words: ``rose`` or ``fell`` only when the
    Wilson intervals do not overlap; that it never succeeded when both rates are 0;
    otherwise that this many episodes cannot tell."""
    lo_hi = (row.get("success_rate_ci95_initial"), row.get("success_rate_ci95_final"))
    if any(not isinstance(ci, list | tuple) or len(ci) != 2 for ci in lo_hi):
        return "not measured"
    (b_lo, b_hi), (a_lo, a_hi) = lo_hi  # type: ignore[misc]
    if a_lo > b_hi:
        return "rose: the intervals do not overlap"
    if a_hi < b_lo:
        return "fell: the intervals do not overlap"
    before, after = row.get("success_rate_initial"), row.get("success_rate_final")
    if before == after == 0:
        # The RL tenants' usual row at demo scale: say what it means, not just "overlap".
        return "never succeeded, before or after: no learning shown at this budget"
    trend = (
        "no change" if before == after else ("higher" if (after or 0) > (before or 0) else "lower")
    )
    return f"{trend}, not told apart: the intervals overlap"


def episodes_label(row: dict[str, Any]) -> str:
    n = row.get("eval_episodes")
    return "– episodes" if not n else f"{n} episode{'' if n == 1 else 's'}"


def _success_table(tenants: dict[str, dict[str, Any]]) -> Table | None:
    """Each trainable tenant's success rate before → after, or None when none was
    measured (``--success-episodes 0``)."""
    measured = {
        t: row
        for t, row in tenants.items()
        if row.get("eval_episodes") or row.get("success_errors")
    }
    if not measured:
        return None
    seeds = sorted(
        {
            (row["eval_first_seed"], row["eval_episodes"])
            for row in measured.values()
            if row.get("eval_first_seed") is not None and row.get("eval_episodes")
        }
    )
    on = ", ".join(f"{s0}…{s0 + n - 1}" for s0, n in seeds) if seeds else "fixed evaluation seeds"
    table = Table(
        title="Success rate before → after training (isolated replays, matched updates)",
        caption=f"Episodes succeeded / episodes in the tenant's simulator on seeds {on} "
        "(never the demonstration seeds), before its first update and after its last; "
        "\\[low, high] is the Wilson 95 % interval in percent: overlapping intervals are not "
        "told apart by this many episodes.",
    )
    for col in (
        "tenant",
        "task",
        "updates",
        "success before → after [Wilson 95 %]",
        "what it shows",
    ):
        table.add_column(col)
    for tenant, row in measured.items():
        cell = format_success(row)
        if row.get("success_errors"):
            cell += " — " + "; ".join(row["success_errors"])
        updates = row.get("updates")
        table.add_row(
            escape(tenant),
            str(row.get("task")),
            "–" if updates is None else str(updates),
            escape(cell),
            success_reading(row),
        )
    return table


def report_tables(report: dict[str, Any]) -> list[Table]:
    """Rich tables: utilization (Table 1), device time (Figure 9), per-tenant progress,
    and the trainable tenants' success rate before → after (when measured)."""
    mt, iso = report["multi_tenant"], report["isolated"]
    util = Table(
        title="Model-service utilization (busy seconds / window)",
        caption="Relative improvement = multi-tenant / isolated: above 1x the shared "
        "service was busier (better), below 1x it idled more.",
    )
    for col in ("execution", "Training", "Inference", "window (s)", "wall (s)"):
        util.add_column(col, justify="left" if col == "execution" else "right")
    util.add_row(
        "Isolated single-tenant (mean of RL replays)",
        _pct(iso["training_utilization"]),
        _pct(iso["inference_utilization"]),
        _num(iso["window_s"], 1),
        _num(iso["wall_s"], 1),
    )
    util.add_row(
        "Isolated, all replays incl. SFT (aggregate)",
        _pct(iso["aggregate_training_utilization"]),
        _pct(iso["aggregate_inference_utilization"]),
        "",
        "",
    )
    util.add_row(
        "Multi-tenant (JoyNexus)",
        _pct(mt["training_utilization"]),
        _pct(mt["inference_utilization"]),
        _num(mt["window_s"], 1),
        _num(mt["wall_s"], 1),
    )
    lock = mt.get("inference_lock_wait") or {}
    if lock.get("batches"):
        util.caption = f"{util.caption}" + (
            f" Multi-tenant inference batches waited {_num(lock['ms_per_batch'], 1)} ms each "
            f"for the backbone lock training shares ({_pct(lock['fraction_of_device_s'])} "
            "of their device time; serve --inference-backbone copy removes the wait)."
        )
    imp = report["improvement"]
    util.add_row(
        "Relative improvement",
        f"{_num(imp['training_utilization'], 2)}x",
        f"{_num(imp['inference_utilization'], 2)}x",
        "",
        "",
    )
    dev = Table(
        title="Device time for the same matched work",
        caption="isolated / multi-tenant above 1x: the multi-tenant run needed less device "
        "time (better); below 1x: more (worse).",
    )
    for col in ("accounting", "multi-tenant (s)", "isolated (s)", "isolated / multi-tenant"):
        dev.add_column(col, justify="left" if col == "accounting" else "right")
    d = report["device_time"]
    dev.add_row(
        "measured: window x 1 machine",
        _num(d["multi_tenant_s"], 1),
        _num(d["isolated_s"], 1),
        f"{_num(report['device_time_ratio'], 2)}x",
    )
    lw = d["layout_weighted"]
    dev.add_row(
        "layout-weighted: 2-2-4 (8) vs 1-1-2 (4)",
        _num(lw["multi_tenant_device_s"], 1),
        _num(lw["isolated_device_s"], 1),
        f"{_num(report['device_time_ratio_layout_weighted'], 2)}x",
    )
    ten = Table(title="Per-tenant progress (matched work)")
    for col in (
        "tenant",
        "task",
        "updates",
        "MT time to matched (s)",
        "iso time (s)",
        "loss first→last (MT)",
        "return first→last (MT)",
    ):
        ten.add_column(col)
    iso_by_tenant = {r["tenant"]: r for r in iso["replays"]}
    for tenant, row in mt["tenants"].items():
        rep = iso_by_tenant.get(tenant)
        iso_updates = rep["tenant_row"]["updates_in_window"] if rep else 0
        ten.add_row(
            tenant,
            str(row["task"]),
            f"{row['updates_in_window']} (iso {iso_updates})",
            _num(row["time_to_matched_s"], 1),
            _num(rep["window_s"], 1) if rep else "–",
            f"{_num(row['loss_first'])}→{_num(row['loss_last'])}",
            f"{_num(row['return_first'])}→{_num(row['return_last'])}"
            if row["task"] == "rl"
            else "–",
        )
    success = _success_table((report.get("success_rates") or {}).get("tenants", {}))
    return [util, dev, ten] if success is None else [util, dev, ten, success]


def write_report(report: dict[str, Any], out_dir: Path) -> Path:
    """Write ``report.json`` (sorted keys, 2-space indent)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return path
