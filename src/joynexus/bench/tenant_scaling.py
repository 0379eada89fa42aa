"""``joynexus bench serving --tenants 1,2,4,...``: how cost grows with tenants.

One shared ``joynexus serve`` deployment runs the whole sweep. First memory: after a
warm-up on one tenant, tenants (each a ``custom`` workload with its own OFT head, as
:mod:`joynexus.bench.serving`'s) are added up to each count with no load in between and
the server tree's RSS is read; the memory each added tenant costs is the least-squares
slope of that RSS over the tenant count (and the endpoint difference), set beside the
resident backbone (the saved weights' size). Then load: per count, the first n tenants'
closed-loop clients load the server for ``duration_s``: req/s, p50/p99, the peak RSS
(which also holds the working memory of batches that grow with the rows in flight) and
PSS.

Against it, one single-policy server per tenant, grown the same way, for as long as the
servers fit ``memory_budget_mb`` (each estimated at the first one's measured RSS); past
that the baseline's memory is *computed* (per-server RSS × tenants, flagged
``computed``) and its throughput is not measured.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from joynexus.bench.server_procs import (
    Server,
    running_servers,
    start_server,
    stop_servers,
    wait_ready,
)
from joynexus.bench.serving import (
    IMAGE_SIZE,
    STATE_DIM,
    _open_tenant,
    _side,
    _Target,
    build_model,
    model_mb,
)
from joynexus.utils.affinity import available_cores

__all__ = ["DEFAULT_BUDGET_MB", "fit_slope", "run_tenant_scaling", "write_plot"]

#: The baseline's servers stop being added past this many MiB (a shared CPU box).
DEFAULT_BUDGET_MB = 6000.0
#: Targets (issue 48): memory per added tenant ≤ 2 % of the resident backbone at the
#: small size; throughput at 64 tenants ≥ 90 % of that at 8.
PER_TENANT_TARGET = 0.02
THROUGHPUT_TARGET = 0.9


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (NaN with fewer than two distinct xs)."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0:
        return float("nan")
    return float(np.polyfit(x, y, 1)[0])


def _fresh(targets: Sequence[_Target]) -> list[_Target]:
    """The same endpoints with empty latency records (one list per measured point)."""
    return [_Target(t.tenant, t.url, t.key) for t in targets]


def _point(
    label: str, servers: Sequence[Server], targets: Sequence[_Target], load: dict[str, Any]
) -> dict[str, Any]:
    rss_open = sum(s.rss() for s in servers) / 2**20
    r = _side(label, servers, _fresh(targets), **load, alone=False)
    keep = ("servers", "requests", "errors", "elapsed_s", "req_per_s", "p50_ms", "p99_ms")
    out = {k: r[k] for k in keep}
    out.update(
        tenants=len(targets),
        rss_after_open_mb=rss_open,
        rss_peak_mb=r["rss_peak_mb"],
        pss_after_mb=r["pss_after_mb"],
        mean_batch_rows=r["stages"]["mean_batch_rows"],
        mean_batch_tenants=r["stages"]["mean_batch_tenants"],
        # Where a request's time went (the server's own stage meters): which stage
        # grows with the tenants.
        stages=r["stages"],
    )
    return out


def _ours(
    root: Path,
    counts: Sequence[int],
    model: str,
    threads: int,
    load: dict[str, Any],
    say: Callable[[str], None],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One shared server: (the load points, the memory points).

    Memory first, with no load in between: after a warm-up on the first tenant (the
    first forwards' allocations belong to the server, not to the second tenant),
    tenants are added up to each count and the server's RSS is read, so its growth is
    what the tenants hold and nothing else. The load sweep follows on the first n of
    those tenants: a batch's working memory grows with the rows in flight, which the
    peak RSS of each load point shows apart.
    """
    points: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    with running_servers(root / "ours", ["server"], model, threads) as (server,):
        targets = [_Target("t0", server.url, _open_tenant(server, "t0", model))]
        say("ours: warm-up on the first tenant")
        warm = {**load, "duration_s": min(2.0, load["duration_s"]), "requests": 3}
        _side("warm-up", [server], _fresh(targets), **warm, alone=False)
        for n in counts:
            say(f"ours: adding tenants up to {n} (no load)")
            while len(targets) < n:
                name = f"t{len(targets)}"
                targets.append(_Target(name, server.url, _open_tenant(server, name, model)))
            memory.append({"tenants": n, "rss_idle_mb": server.rss() / 2**20})
        for n in counts:
            say(f"ours: {n} tenants x {load['clients']} clients for {load['duration_s']:g} s")
            points.append(_point("ours", [server], targets[:n], load))
    return points, memory


def _baseline(
    root: Path,
    counts: Sequence[int],
    model: str,
    threads: int,
    load: dict[str, Any],
    budget_mb: float,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    servers: list[Server] = []
    targets: list[_Target] = []
    per_server_mb = 0.0
    try:
        for n in counts:
            if per_server_mb and n * per_server_mb > budget_mb:
                say(f"baseline: {n} servers would need ~{n * per_server_mb:.0f} MiB: computed")
                points.append(
                    {
                        "tenants": n,
                        "servers": n,
                        "computed": True,
                        "rss_peak_mb": n * per_server_mb,
                        "req_per_s": None,
                    }
                )
                continue
            say(f"baseline: starting servers up to {n}")
            new = [
                start_server(root / "baseline" / f"t{i}", model, threads, ["--front-procs", "0"])
                for i in range(len(servers), n)
            ]
            servers.extend(new)
            wait_ready(new)
            for i, s in enumerate(new, start=len(targets)):
                targets.append(_Target(f"t{i}", s.url, _open_tenant(s, f"t{i}", model)))
            say(f"baseline: {n} servers x {load['clients']} clients for {load['duration_s']:g} s")
            point = _point("baseline", servers, targets, load)
            point["computed"] = False
            points.append(point)
            per_server_mb = max(per_server_mb, point["rss_peak_mb"] / n)
    finally:
        stop_servers(servers)
    return points


def _summary(
    ours: Sequence[dict[str, Any]],
    memory: Sequence[dict[str, Any]],
    base: Sequence[dict[str, Any]],
    backbone_mb: float,
) -> dict[str, Any]:
    ns = [p["tenants"] for p in ours]
    peak = [p["rss_peak_mb"] for p in ours]
    idle = [p["rss_idle_mb"] for p in memory]
    slope_idle = fit_slope([p["tenants"] for p in memory], idle)
    span = ns[-1] - ns[0]
    by_n = {p["tenants"]: p for p in ours}
    base_by_n = {p["tenants"]: p for p in base}
    out: dict[str, Any] = {
        "backbone_weights_mb": backbone_mb,
        # What a tenant holds: the fit of the idle server's RSS over the tenants added.
        "mb_per_added_tenant": slope_idle,
        "mb_per_added_tenant_endpoints": (idle[-1] - idle[0]) / span if span else float("nan"),
        # Under load the peak also holds the larger batches' working memory.
        "mb_per_added_tenant_fit_peak": fit_slope(ns, peak),
        "per_tenant_fraction_of_backbone": slope_idle / backbone_mb if backbone_mb else None,
        "per_tenant_target": PER_TENANT_TARGET,
        "memory_ratio_by_tenants": {
            str(n): base_by_n[n]["rss_peak_mb"] / by_n[n]["rss_peak_mb"]
            for n in ns
            if n in base_by_n and by_n[n]["rss_peak_mb"] > 0
        },
    }
    if 8 in by_n and 64 in by_n and by_n[8]["req_per_s"] > 0:
        out["throughput_64_over_8"] = by_n[64]["req_per_s"] / by_n[8]["req_per_s"]
        out["throughput_target"] = THROUGHPUT_TARGET
    return out


def run_tenant_scaling(
    *,
    tenants: Sequence[int],
    size: str = "tiny",
    arch: str = "qwen2_5_vl",
    clients_per_tenant: int = 1,
    duration_s: float = 10.0,
    requests: int | None = None,
    threads: int = 1,
    ours_threads: int | None = None,
    memory_budget_mb: float = DEFAULT_BUDGET_MB,
    baseline: bool = True,
    model_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The sweep over ``tenants`` (sorted, distinct), ours then the baseline.

    Args:
        tenants: Tenant counts, e.g. ``[1, 2, 4, 8, 16, 32, 64]``.
        size, arch: The backbone (:func:`joynexus.bench.serving.build_model`).
        clients_per_tenant, duration_s, requests: The closed-loop load at each count.
        threads, ours_threads: OMP threads of each baseline server and of ours.
        memory_budget_mb: The baseline's servers are added while they fit in this.
        baseline: Also run one server per tenant.
        model_dir: A saved model to serve instead of building one.

    Raises:
        ValueError: no counts, or a count below 1.
    """
    counts = sorted(set(tenants))
    if not counts or counts[0] < 1:
        raise ValueError(f"tenants: positive counts expected, got {list(tenants)}")
    say = progress or (lambda _line: None)
    load = {"clients": clients_per_tenant, "duration_s": duration_s, "requests": requests}
    ours_threads = ours_threads or len(available_cores())
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="joynexus-bench-scaling-") as tmp:
        root = Path(tmp)
        if model_dir is None:
            say(f"building the {size} {arch} model")
            model_dir = build_model(arch, size, root / "model")
        backbone_mb = model_mb(model_dir)
        ours, memory = _ours(root, counts, str(model_dir), ours_threads, load, say)
        base = (
            _baseline(root, counts, str(model_dir), threads, load, memory_budget_mb, say)
            if baseline
            else []
        )
    return {
        "config": {
            "scenario": "tenant-scaling",
            "tenants": counts,
            "size": size,
            "arch": arch,
            "clients_per_tenant": clients_per_tenant,
            "duration_s": duration_s,
            "requests_per_client": requests,
            "threads_per_server": threads,
            "ours_threads": ours_threads,
            "memory_budget_mb": memory_budget_mb,
            "cpu_count": os.cpu_count(),
            "load_avg_1m_at_start": load_start,
            "load_avg_1m_at_end": os.getloadavg()[0],
            "observation": f"1 x {IMAGE_SIZE}x{IMAGE_SIZE} camera + state[{STATE_DIM}]",
        },
        "ours": ours,
        "memory": memory,
        "baseline": base,
        "summary": _summary(ours, memory, base, backbone_mb),
    }


def write_plot(result: dict[str, Any], out: Path) -> Path:
    """Throughput, latency and memory against tenants (one PNG, three panels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours, base = result["ours"], result["baseline"]
    cfg = result["config"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    n = [p["tenants"] for p in ours]
    axes[0].plot(n, [p["req_per_s"] for p in ours], "o-", label="one shared server")
    measured = [p for p in base if not p.get("computed")]
    if measured:
        axes[0].plot(
            [p["tenants"] for p in measured],
            [p["req_per_s"] for p in measured],
            "s--",
            label="one server per tenant",
        )
    axes[0].set_ylabel("requests / s")
    axes[1].plot(n, [p["p50_ms"] for p in ours], "o-", label="shared p50")
    axes[1].plot(n, [p["p99_ms"] for p in ours], "o-", label="shared p99")
    if measured:
        axes[1].plot(
            [p["tenants"] for p in measured],
            [p["p99_ms"] for p in measured],
            "s--",
            label="per-tenant servers p99",
        )
    axes[1].set_ylabel("latency (ms)")
    axes[2].plot(n, [p["rss_peak_mb"] for p in ours], "o-", label="shared server RSS")
    if measured:
        axes[2].plot(
            [p["tenants"] for p in measured],
            [p["rss_peak_mb"] for p in measured],
            "s--",
            label="per-tenant servers RSS (measured)",
        )
    computed = [p for p in base if p.get("computed")]
    if computed:
        axes[2].plot(
            [p["tenants"] for p in computed],
            [p["rss_peak_mb"] for p in computed],
            "x:",
            label="per-tenant servers RSS (computed)",
        )
    axes[2].set_ylabel("RSS (MiB)")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tenants")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"tenant scaling: {cfg['arch']} {cfg['size']}, {cfg['clients_per_tenant']} client(s) "
        f"per tenant, {cfg['duration_s']:g} s per point, load avg "
        f"{cfg['load_avg_1m_at_start']:.1f}-{cfg['load_avg_1m_at_end']:.1f} on "
        f"{cfg['cpu_count']} CPUs"
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
