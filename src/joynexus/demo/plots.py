"""The demo's figures: utilization timelines, device time, curves and success rates.

:func:`plot_report` draws what :func:`joynexus.demo.report.build_report` measured into
PNG files (matplotlib, Agg backend); the numbers themselves live in ``report.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from joynexus.demo.idle import IDLE_CAUSES, idle_timeline, split_stretch
from joynexus.demo.phase import PhaseTrace
from joynexus.demo.readout import episodes_label
from joynexus.demo.report import loss_curve, return_curve

__all__ = [
    "IDLE_STYLE",
    "MULTI_TENANT_COLOR",
    "device_idle_figure",
    "device_time_bars",
    "device_time_figure",
    "label_spans",
    "plot_report",
    "success_bars",
    "utilization_figure",
]

#: The multi-tenant bar of ``device_time.png``: one run of every tenant together, so a
#: neutral colour no tenant of the isolated stack gets.
MULTI_TENANT_COLOR = "#4d4d4d"
# matplotlib's tab10 without its grey (too close to the multi-tenant bar's).
_TENANT_COLORS = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
)


def _timeline(trace: PhaseTrace, service: str, bins: int) -> tuple[list[float], list[float]]:
    width = trace.window_s / bins
    xs, ys = [], []
    for k in range(bins):
        lo = trace.started_at + k * width
        busy = sum(
            max(0.0, min(iv.end, lo + width) - max(iv.start, lo))
            for iv in trace.busy
            if iv.service == service
        )
        xs.append(k * width + width / 2)
        ys.append(busy / width)
    return xs, ys


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_report(
    report: dict[str, Any],
    multi: PhaseTrace,
    isolated: Sequence[PhaseTrace],
    out_dir: Path,
) -> list[Path]:
    """Write ``utilization.png``, ``device_time.png``, ``device_idle.png``, ``curves.png``
    and, when a tenant's success rate was measured, ``success.png`` into ``out_dir``;
    their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        _save(utilization_figure(multi, isolated), out_dir / "utilization.png"),
        _save(device_time_figure(report, multi, isolated), out_dir / "device_time.png"),
        _save(device_idle_figure(report, multi), out_dir / "device_idle.png"),
        _save(_curves_figure(report, multi, isolated), out_dir / "curves.png"),
    ]
    rows = (report.get("success_rates") or {}).get("tenants", {})
    measured = {t: r for t, r in rows.items() if r.get("eval_episodes")}
    if measured:
        fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(measured) + 2), 3.8))
        success_bars(ax, measured)
        fig.tight_layout()
        paths.append(_save(fig, out_dir / "success.png"))
    return paths


def _legend_outside(ax: Any, **kwargs: Any) -> Any:
    """A legend to the right of the axes, off the data."""
    return ax.legend(
        loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, **kwargs
    )


#: Height of one row of replay names above the isolated panel, in points.
_ROW_PT = 10.0
#: Rows of names before a name is left to the legend alone.
_MAX_ROWS = 4


def label_spans(ax: Any, spans: Sequence[tuple[float, str]]) -> list[Any]:
    """Name each span (start in data coordinates, name) above the axes; a name that
    would overlap one already placed goes up a row, so short neighbouring replays stay
    readable (after :data:`_MAX_ROWS` rows the legend alone names it). Call it once the
    figure's layout is fixed: the check uses the names' drawn sizes. The names placed."""
    renderer = ax.figure.canvas.get_renderer()
    placed: list[tuple[Any, Any]] = []
    for start, name in spans:
        for row in range(_MAX_ROWS):
            text = ax.annotate(
                name,
                xy=(start, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(2.0, 3.0 + row * _ROW_PT),
                textcoords="offset points",
                fontsize=7,
                va="bottom",
            )
            box = text.get_window_extent(renderer).expanded(1.05, 1.0)
            if not any(box.overlaps(other) for _, other in placed):
                placed.append((text, box))
                break
            text.remove()
    return [text for text, _ in placed]


def utilization_figure(multi: PhaseTrace, isolated: Sequence[PhaseTrace]) -> Any:
    """Busy fraction per time bin: the multi-tenant run above, the isolated replays one
    after another below, each replay's span shaded in its tenant's colour, named above
    the panel and in the legend."""
    import matplotlib.pyplot as plt

    colors = {"training": "tab:blue", "inference": "tab:orange"}
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharey=True)
    # A fixed layout: the names above the lower panel are placed by their drawn size.
    fig.subplots_adjust(left=0.07, right=0.75, bottom=0.09, top=0.94, hspace=0.62)
    for service, color in colors.items():
        xs, ys = _timeline(multi, service, 40)
        axes[0].plot(xs, ys, color=color, label=service)
    axes[0].set_title("multi-tenant: busy fraction per time bin", fontsize=10)
    offset, spans = 0.0, []
    for i, tr in enumerate(isolated):
        tenant = next(iter(tr.matched))
        axes[1].axvspan(
            offset,
            offset + tr.window_s,
            color=_TENANT_COLORS[i % len(_TENANT_COLORS)],
            alpha=0.12,
            lw=0,
            label=f"isolated: {tenant}",
        )
        for service, color in colors.items():
            xs, ys = _timeline(tr, service, 15)
            axes[1].plot(
                [x + offset for x in xs], ys, color=color, label=service if i == 0 else None
            )
        spans.append((offset, tenant))
        offset += tr.window_s
    axes[1].set_xlim(0, max(offset, 1e-9))
    for ax in axes:
        ax.set_ylim(0, 1.0)
        ax.set_ylabel("utilization")
        # The services first, then the replays' spans in the order they ran.
        handles, labels = ax.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda k: labels[k].startswith("isolated"))
        _legend_outside(ax, handles=[handles[k] for k in order], labels=[labels[k] for k in order])
    axes[1].set_xlabel("seconds since the loops started")
    names = label_spans(axes[1], spans)
    rows = 1 + max((round((t.xyann[1] - 3.0) / _ROW_PT) for t in names), default=0)
    axes[1].set_title(
        "isolated replays, one after another", fontsize=10, pad=6.0 + rows * _ROW_PT + 4.0
    )
    return fig


def device_time_figure(
    report: dict[str, Any], multi: PhaseTrace, isolated: Sequence[PhaseTrace]
) -> Any:
    """The device-time bars, the ratio, bound and efficiency in the title, the legend
    beside the axes."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    fig.subplots_adjust(left=0.1, right=0.62, bottom=0.1, top=0.84)
    device_time_bars(
        ax, multi.own_window_s, [(next(iter(tr.matched)), tr.own_window_s) for tr in isolated]
    )
    ax.set_ylabel("device-seconds\n((window - interference) x 1 machine)")
    title = (
        "device time, same matched work: isolated / multi-tenant = "
        f"{report['device_time_ratio']}x (above 1 is better)"
    )
    bound = report.get("device_time_bound") or {}
    if isinstance(bound.get("bound"), int | float):
        eff = bound.get("efficiency")
        title += f"\nbound {bound['bound']}x (limited by the {bound['limited_by']})"
        title += "" if eff is None else f", efficiency {eff}"
    ax.set_title(title, fontsize=9)
    _legend_outside(ax, title="one colour per run")
    return fig


#: ``device_idle.png``'s colours and hatches: stretch is busy but drawn apart from the
#: replays' own device work.
IDLE_STYLE = {
    "work": ("tab:blue", "", "device busy: the replays' work"),
    "stretch": ("#9ecae1", "///", "device busy: stretch (longer than alone)"),
    "host_work_of_a_leased_job": ("tab:red", "", "idle: host work of a leased job"),
    "waiting_for_simulators": ("tab:orange", "", "idle: waiting for simulators"),
    "nothing_measured": ("lightgrey", "", "idle: nothing measured"),
}


def device_idle_figure(report: dict[str, Any], multi: PhaseTrace) -> Any:
    """The multi-tenant window per time bin: the replays' device work, stretch (spread
    over the busy time in proportion, see :func:`~joynexus.demo.idle.split_stretch`)
    and idle by cause, the legend beside the axes."""
    import matplotlib.pyplot as plt

    tl = idle_timeline(multi, bins=60)
    idle = report.get("device_idle") or {}
    work, stretch = split_stretch(
        tl["busy"],
        float(idle.get("device_busy_s") or 0.0),
        float(idle.get("isolated_device_busy_s") or 0.0),
    )
    series = {"work": work, "stretch": stretch, **{c: tl[c] for c in IDLE_CAUSES}}
    fig, ax = plt.subplots(figsize=(10, 3.4))
    fig.subplots_adjust(left=0.07, right=0.68, bottom=0.15, top=0.88)
    ax.stackplot(
        tl["t"],
        *series.values(),
        labels=[IDLE_STYLE[k][2] for k in series],
        colors=[IDLE_STYLE[k][0] for k in series],
        hatch=[IDLE_STYLE[k][1] for k in series],
        edgecolor="white",
        lw=0.0,
    )
    ax.set_ylim(0, 1.0)
    ax.set_xlim(0, multi.window_s)
    ax.set_xlabel("seconds since the loops started (multi-tenant window)")
    ax.set_ylabel("fraction of the bin")
    ax.set_title("multi-tenant: where the device was busy, and why it idled", fontsize=9)
    _legend_outside(ax)
    return fig


def _curves_figure(
    report: dict[str, Any], multi: PhaseTrace, isolated: Sequence[PhaseTrace]
) -> Any:
    import matplotlib.pyplot as plt

    tenants = list(report["multi_tenant"]["tenants"])
    iso_by_tenant = {next(iter(tr.matched)): tr for tr in isolated}
    fig, axes = plt.subplots(2, len(tenants), figsize=(3.2 * len(tenants), 5.5), squeeze=False)
    for j, tenant in enumerate(tenants):
        ax_l, ax_r = axes[0][j], axes[1][j]
        runs: list[tuple[str, PhaseTrace | None, str]] = [
            ("multi-tenant", multi, "-"),
            ("isolated", iso_by_tenant.get(tenant), "--"),
        ]
        for label, run, ls in runs:
            if run is None:
                continue
            recs = run.records.get(tenant, [])
            losses = loss_curve(recs)
            ax_l.plot(range(1, len(losses) + 1), losses, ls=ls, marker=".", label=label)
            rets = return_curve(recs)
            if rets:
                ax_r.plot(range(1, len(rets) + 1), rets, ls=ls, marker=".", label=label)
        ax_l.set_title(tenant, fontsize=9)
        ax_l.set_xlabel("update")
        ax_r.set_xlabel("rollout")
        if j == 0:
            ax_l.set_ylabel("loss")
            ax_r.set_ylabel("mean episode return")
        ax_l.legend(fontsize=7)
        if not ax_r.lines:
            ax_r.text(0.5, 0.5, "SFT: no rollouts", ha="center", transform=ax_r.transAxes)
    fig.tight_layout()
    return fig


def success_bars(ax: Any, rows: dict[str, dict[str, Any]]) -> list[Any]:
    """Draw each tenant's success rate before and after training as two bars with
    their Wilson 95 % intervals as error bars (a rate not measured draws no bar);
    the bar containers, before then after."""
    tenants = list(rows)
    width = 0.38
    drawn = []
    for k, (phase, label, color) in enumerate(
        (
            ("initial", "before training", "tab:gray"),
            ("final", "after training", "tab:green"),
        )
    ):
        xs, rates, low, high = [], [], [], []
        for i, tenant in enumerate(tenants):
            rate = rows[tenant].get(f"success_rate_{phase}")
            if rate is None:
                continue
            ci = rows[tenant].get(f"success_rate_ci95_{phase}") or (rate, rate)
            xs.append(i + (k - 0.5) * width)
            rates.append(rate)
            low.append(max(rate - ci[0], 0.0))
            high.append(max(ci[1] - rate, 0.0))
        drawn.append(
            ax.bar(
                xs,
                rates,
                width,
                yerr=[low, high],
                capsize=4,
                color=color,
                label=label,
                error_kw={"elinewidth": 1},
            )
        )
        # The rate in words above its interval (a rate of 0 draws no bar).
        for x, rate, up in zip(xs, rates, high, strict=True):
            ax.text(x, rate + up + 0.01, f"{100 * rate:.0f} %", ha="center", fontsize=7)
    ax.set_xticks(
        range(len(tenants)),
        [f"{t}\n({episodes_label(rows[t])})" for t in tenants],
        fontsize=8,
    )
    ax.set_ylim(0, 1.2)  # room for the legend above a rate of 1
    ax.set_yticks([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("success rate")
    ax.set_title(
        "success rate before -> after training, isolated replays (Wilson 95 % intervals)",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    return drawn


def device_time_bars(
    ax: Any, multi_window_s: float, isolated: Sequence[tuple[str, float]]
) -> tuple[Any, list[Any]]:
    """Draw the device-time bars: the multi-tenant run in :data:`MULTI_TENANT_COLOR`
    (all tenants, one run) and the isolated replays stacked, one colour per tenant
    from a palette that never uses the multi-tenant colour; the bar containers."""
    multi = ax.bar(
        ["multi-tenant"],
        [multi_window_s],
        color=MULTI_TENANT_COLOR,
        hatch="//",
        edgecolor="white",
        label="multi-tenant: all tenants, one run",
    )
    palette = _TENANT_COLORS
    stacked, bottom = [], 0.0
    for i, (tenant, window_s) in enumerate(isolated):
        stacked.append(
            ax.bar(
                ["isolated"],
                [window_s],
                bottom=[bottom],
                color=palette[i % len(palette)],
                label=f"isolated: {tenant}",
            )
        )
        bottom += window_s
    return multi, stacked
