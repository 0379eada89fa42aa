"""The demo's figures: utilization timelines, device time, curves and success rates.

:func:`plot_report` draws what :func:`joynexus.demo.report.build_report` measured into
PNG files (matplotlib, Agg backend); the numbers themselves live in ``report.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from joynexus.demo.idle import IDLE_CAUSES, idle_timeline
from joynexus.demo.phase import PhaseTrace
from joynexus.demo.report import episodes_label, loss_curve, return_curve

__all__ = ["MULTI_TENANT_COLOR", "device_time_bars", "plot_report", "success_bars"]

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
    paths: list[Path] = []
    colors = {"training": "tab:blue", "inference": "tab:orange"}

    fig, axes = plt.subplots(2, 1, figsize=(9, 5.5), sharey=True)
    for service, color in colors.items():
        xs, ys = _timeline(multi, service, 40)
        axes[0].plot(xs, ys, color=color, label=service)
    axes[0].set_title("multi-tenant: busy fraction per time bin")
    offset = 0.0
    for i, tr in enumerate(isolated):
        for service, color in colors.items():
            xs, ys = _timeline(tr, service, 15)
            axes[1].plot(
                [x + offset for x in xs], ys, color=color, label=service if i == 0 else None
            )
        axes[1].axvline(offset, color="grey", lw=0.6, ls=":")
        axes[1].text(offset, 1.02, next(iter(tr.matched)), fontsize=7, va="bottom")
        offset += tr.window_s
    axes[1].set_title("isolated replays, one after another", pad=14)
    for ax in axes:
        ax.set_ylim(0, 1.0)
        ax.set_ylabel("utilization")
        ax.legend(loc="upper right", fontsize=8)
    axes[1].set_xlabel("seconds since the loops started")
    fig.tight_layout()
    p = out_dir / "utilization.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    device_time_bars(ax, multi.window_s, [(next(iter(tr.matched)), tr.window_s) for tr in isolated])
    ax.set_ylabel("device-seconds (window x 1 machine)")
    ax.set_title(
        f"device time, same matched work: isolated / multi-tenant = "
        f"{report['device_time_ratio']}x (above 1 is better)",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    p = out_dir / "device_time.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)

    tl = idle_timeline(multi, bins=60)
    fig, ax = plt.subplots(figsize=(9, 3.2))
    keys = ("busy", *IDLE_CAUSES)
    ax.stackplot(
        tl["t"],
        *[tl[k] for k in keys],
        labels=["device busy", *(f"idle: {c.replace('_', ' ')}" for c in IDLE_CAUSES)],
        colors=["tab:blue", "tab:red", "tab:orange", "lightgrey"],
    )
    ax.set_ylim(0, 1.0)
    ax.set_xlabel("seconds since the loops started (multi-tenant window)")
    ax.set_ylabel("fraction of the bin")
    ax.set_title("multi-tenant: where the device was busy, and why it idled", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    p = out_dir / "device_idle.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)

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
    p = out_dir / "curves.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)

    rows = (report.get("success_rates") or {}).get("tenants", {})
    measured = {t: r for t, r in rows.items() if r.get("eval_episodes")}
    if measured:
        fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(measured) + 2), 3.8))
        success_bars(ax, measured)
        fig.tight_layout()
        p = out_dir / "success.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        paths.append(p)
    return paths


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
