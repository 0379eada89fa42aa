"""The demo's report in words and tables, in the order a reader needs it.

:func:`print_report` prints what ``joynexus demo`` shows, leading with what it shows:

1. **Device time** — isolated / multi-tenant device time for the same matched work
   (each phase's window less its interference: the device's work ready but its core
   running something else), this machine's bound for it and the efficiency (the share
   of the possible gain reached); then the interference apart with the wall-clock
   ratio, the machine's load during the phases, the table and where the multi-tenant
   window went;
2. **What each tenant learned** — success rate before → after training with Wilson
   95 % intervals, then each tenant's loss and return;
3. **Utilization** — the two utilizations side by side. No "improvement" ratio is
   printed when its denominator is mostly waiting: the isolated RL replays' services
   idle while their simulators step, so multi-tenant / isolated would measure that
   waiting, not a gain from sharing (:func:`utilization_reading`).

The numbers come from ``report.json`` (:func:`joynexus.demo.report.build_report`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = [
    "MOSTLY_BUSY",
    "episodes_label",
    "format_success",
    "idle_line",
    "interference_line",
    "load_line",
    "print_report",
    "report_tables",
    "success_reading",
    "utilization_lines",
    "utilization_reading",
    "verdict",
]

#: An isolated utilization at least this high is "mostly busy": only then is
#: multi-tenant / isolated a gain from sharing rather than a measure of the waiting.
MOSTLY_BUSY = 0.5


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


def episodes_label(row: Mapping[str, Any]) -> str:
    n = row.get("eval_episodes")
    return "– episodes" if not n else f"{n} episode{'' if n == 1 else 's'}"


def format_success(row: Mapping[str, Any]) -> str:
    """A tenant's success rate before → after with Wilson 95 % intervals in percent,
    e.g. ``0 % [0, 28] → 40 % [17, 69] (10 episodes)``; ``–`` for a rate not measured."""
    before = _rate(row.get("success_rate_initial"), row.get("success_rate_ci95_initial"))
    after = _rate(row.get("success_rate_final"), row.get("success_rate_ci95_final"))
    return f"{before} → {after}" + (f" ({episodes_label(row)})" if row.get("eval_episodes") else "")


def success_reading(row: Mapping[str, Any]) -> str:
    """What a tenant's before → after says, in words: ``rose`` or ``fell`` only when the
    Wilson intervals do not overlap; that it never succeeded when both rates are 0;
    otherwise that this many episodes cannot tell."""
    lo_hi = (row.get("success_rate_ci95_initial"), row.get("success_rate_ci95_final"))
    if any(not isinstance(ci, list | tuple) or len(ci) != 2 for ci in lo_hi):
        return "not measured"
    (b_lo, b_hi), (a_lo, a_hi) = lo_hi  # type: ignore[misc]  # pairs: checked above
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


def utilization_reading(
    service: str, multi_tenant: float | None, isolated: float | None, simulators: float | None
) -> tuple[float | None, str]:
    """The ratio multi-tenant / isolated utilization of ``service`` when it means a gain
    (the isolated service was mostly busy, :data:`MOSTLY_BUSY`), else None, and a
    sentence saying how to read the two utilizations.

    Args:
        service: ``training`` or ``inference``.
        multi_tenant / isolated: The utilizations (busy seconds / window).
        simulators: The share of the isolated RL replays' windows in which a simulator
            was stepping (None: not measured).
    """
    if multi_tenant is None or isolated is None:
        return None, f"{service}: not measured"
    both = f"{service}: multi-tenant {_pct(multi_tenant)} vs isolated RL replays {_pct(isolated)}"
    if isolated >= MOSTLY_BUSY:
        ratio = multi_tenant / isolated
        return ratio, f"{both} (multi-tenant / isolated {ratio:.2f}x; above 1 is busier shared)"
    sims = "" if simulators is None else f" (their simulators stepped {_pct(simulators)} of them)"
    return None, (
        f"{both}: alone, the {service} service idled {_pct(1 - isolated)} of the replays' "
        f"windows{sims}, so a ratio of the two would mostly measure that idle time, not a "
        "gain from sharing"
    )


def verdict(report: Mapping[str, Any]) -> str:
    """One sentence on the device-time ratio, saying which way is good, with the bound."""
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
    return f"device time: {outcome}"


def interference_line(report: Mapping[str, Any]) -> str:
    """The interference taken out of the device times, and the wall-clock ratio that
    keeps it in."""
    d = report.get("device_time") or {}
    inter, wall = d.get("interference") or {}, d.get("wall") or {}
    if not isinstance(wall.get("ratio"), int | float):
        return "interference: not measured"
    return (
        f"interference (the device's work ready, its core running something else): "
        f"multi-tenant {_num(inter.get('multi_tenant_s'), 1)} s, isolated replays "
        f"{_num(inter.get('isolated_s'), 1)} s, left out of the device times above; "
        f"with it, on the wall clock, the ratio is {wall['ratio']:.2f}x "
        f"({_num(wall.get('isolated_s'), 1)} s / {_num(wall.get('multi_tenant_s'), 1)} s)"
    )


def _load_range(phase: Mapping[str, Any]) -> str:
    la = phase.get("load_average_1min") or {}
    if la.get("min") is None:
        return "–"
    return f"{la['min']:.1f}–{la['max']:.1f} (mean {la['mean']:.1f})"


def load_line(report: Mapping[str, Any]) -> str:
    """How loaded the machine was: the 1-minute load average over the multi-tenant
    phase and over the replays, and what else ran on the device's cores."""
    phases = ((report.get("machine") or {}).get("phases")) or {}
    if not phases:
        return "machine load: not measured"
    multi = phases.get("multi-tenant", {})
    replays = [v for k, v in phases.items() if k != "multi-tenant"]
    lows = [
        v["load_average_1min"]["min"]
        for v in replays
        if (v.get("load_average_1min") or {}).get("min") is not None
    ]
    highs = [
        v["load_average_1min"]["max"]
        for v in replays
        if (v.get("load_average_1min") or {}).get("max") is not None
    ]
    iso = f"{min(lows):.1f}–{max(highs):.1f}" if lows and highs else "–"
    text = (
        f"machine load (1-minute load average, {report.get('machine', {}).get('cpu_cores')} "
        f"cores): multi-tenant {_load_range(multi)}, isolated replays {iso}"
    )
    if isinstance(multi.get("device_cores_other_s"), int | float):
        text += (
            f"; the device's core(s) {multi.get('device_cores')} ran "
            f"{multi['device_cores_other_s']:.0f} s of other work during the multi-tenant "
            f"phase ({multi.get('period_s', 0):.0f} s)"
        )
    return text


def idle_line(report: Mapping[str, Any]) -> str | None:
    """Where the multi-tenant window went: the replays' device work, stretch and idle by
    cause (None when not measured)."""
    idle = report.get("device_idle") or {}
    if not (
        isinstance(idle.get("idle_s"), int | float)
        and isinstance(idle.get("stretch_s"), int | float)
    ):
        return None
    causes = ", ".join(
        f"{k.replace('_', ' ')} {v:.0f} s" for k, v in idle["idle_by_cause_s"].items()
    )
    return (
        f"Of the multi-tenant window's {idle['window_s']:.0f} s, the replays' device "
        f"work took {idle['isolated_device_busy_s']:.0f} s; the rest is "
        f"{idle['stretch_s']:.0f} s of stretch (the same work, longer on the device) "
        f"and {idle['idle_s']:.0f} s of idle device ({causes})"
    )


def _device_table(report: Mapping[str, Any]) -> Table:
    dev = Table(
        title="Device time for the same matched work",
        caption="isolated / multi-tenant above 1x: the multi-tenant run needed less device "
        "time (better); below 1x: more (worse).",
    )
    for col in ("accounting", "multi-tenant (s)", "isolated (s)", "isolated / multi-tenant"):
        dev.add_column(col, justify="left" if col == "accounting" else "right")
    d = report["device_time"]
    dev.add_row(
        "measured: (window - interference) x 1 machine",
        _num(d["multi_tenant_s"], 1),
        _num(d["isolated_s"], 1),
        f"{_num(report['device_time_ratio'], 2)}x",
    )
    wall = d.get("wall") or {}
    if wall:
        dev.add_row(
            "wall clock: window x 1 machine",
            _num(wall.get("multi_tenant_s"), 1),
            _num(wall.get("isolated_s"), 1),
            f"{_num(wall.get('ratio'), 2)}x",
        )
    lw = d["layout_weighted"]
    dev.add_row(
        "layout-weighted: 2-2-4 (8) vs 1-1-2 (4)",
        _num(lw["multi_tenant_device_s"], 1),
        _num(lw["isolated_device_s"], 1),
        f"{_num(report['device_time_ratio_layout_weighted'], 2)}x",
    )
    return dev


def _success_table(tenants: Mapping[str, Mapping[str, Any]]) -> Table | None:
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


def _progress_table(report: Mapping[str, Any]) -> Table:
    mt, iso = report["multi_tenant"], report["isolated"]
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
            escape(tenant),
            str(row["task"]),
            f"{row['updates_in_window']} (iso {iso_updates})",
            _num(row["time_to_matched_s"], 1),
            _num(rep["window_s"], 1) if rep else "–",
            f"{_num(row['loss_first'])}→{_num(row['loss_last'])}",
            f"{_num(row['return_first'])}→{_num(row['return_last'])}"
            if row["task"] == "rl"
            else "–",
        )
    return ten


def _utilization_table(report: Mapping[str, Any]) -> Table:
    mt, iso = report["multi_tenant"], report["isolated"]
    util = Table(title="Model-service utilization (busy seconds / window)")
    for col in ("execution", "Training", "Inference", "window (s)", "wall (s)"):
        util.add_column(col, justify="left" if col == "execution" else "right")
    util.add_row(
        "Multi-tenant (JoyNexus)",
        _pct(mt["training_utilization"]),
        _pct(mt["inference_utilization"]),
        _num(mt["window_s"], 1),
        _num(mt["wall_s"], 1),
    )
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
    return util


def utilization_lines(report: Mapping[str, Any]) -> list[str]:
    """How to read the utilizations, one line per service, and what sharing the
    backbone with training cost inference (when measured)."""
    services = (report.get("utilization") or {}).get("services", {})
    lines = [f"{row['reading']}." for row in services.values()]
    lock = report["multi_tenant"].get("inference_lock_wait") or {}
    if lock.get("batches"):
        # The demo runs one resident backbone that training and inference share: the
        # wait is part of what it measures, not a setting to change here.
        lines.append(
            f"Multi-tenant inference batches waited {_num(lock['ms_per_batch'], 1)} ms each "
            f"for the backbone lock training shares ({_pct(lock['fraction_of_device_s'])} "
            "of their device time)."
        )
    return lines


def report_tables(report: Mapping[str, Any]) -> list[Table]:
    """The report's tables in reading order: device time, success rate before → after
    (when measured), per-tenant progress, utilization."""
    success = _success_table((report.get("success_rates") or {}).get("tenants", {}))
    return [
        _device_table(report),
        *([] if success is None else [success]),
        _progress_table(report),
        _utilization_table(report),
    ]


def print_report(report: Mapping[str, Any], console: Console) -> None:
    """Print the report in reading order (see the module docstring)."""

    def say(text: str) -> None:
        console.print(text, highlight=False, markup=False, emoji=False, soft_wrap=True)

    dev, *learning, util = report_tables(report)
    console.rule("1. Device time", style="dim")
    say(verdict(report))
    say(interference_line(report))
    say(load_line(report))
    console.print(dev)
    idle = idle_line(report)
    if idle is not None:
        say(idle)
    console.rule("2. What each tenant learned", style="dim")
    for table in learning:
        console.print(table)
    console.rule("3. Utilization", style="dim")
    console.print(util)
    for line in utilization_lines(report):
        say(line)
