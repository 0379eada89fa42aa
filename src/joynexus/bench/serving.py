"""``joynexus bench serving``: one shared server against one server per tenant.

Two deployments serve the same N tenants the same closed-loop ``predict`` traffic over
HTTP, one after the other, on this machine:

* **ours**: one ``joynexus serve`` deployment, one resident backbone, every tenant's
  requests group-batched by the Inference Queue; with ``front_procs`` > 0 (the
  default: serve's own, usable cores − 1) its front processes decode and encode HTTP
  and hand the tensors to the model process through shared memory
  (:mod:`joynexus.server.front`); several values run ours once per value against the
  same baseline;
* **baseline**: what users would otherwise run, one single-policy server per tenant
  (a ``joynexus serve --front-procs 0`` hosting that tenant alone: one process, as a
  single-policy server is), each with its own copy of the same backbone.

Every server is a subprocess on a free 127.0.0.1 port, started and always stopped by the
bench (:mod:`joynexus.bench.server_procs`: SIGTERM, then SIGKILL, then whatever the
server left behind), even on an error or Ctrl-C. Memory is the summed RSS of every
server process and its descendants, peak over the timed load (psutil); PSS after the
load is reported too (RSS counts the shared libraries' pages once per process, PSS
divides them between the processes). Ratios: ``throughput_ratio`` = ours ÷ baseline
req/s, ``memory_ratio`` = baseline ÷ ours RSS (``memory_ratio_pss`` the same for PSS),
``p99_ratio`` = ours ÷ baseline p99 latency.

With ``memory_budget_mb`` (the default at ``size="real"``, where one backbone copy is
gigabytes) the baseline starts only as many servers as fit in that budget, each server
estimated at ours' measured peak: those tenants' servers are measured, and the memory of
one server per tenant for all of them is *computed* from the measured per-server RSS
(``baseline.computed``, flagged in the report); its req/s is what the measured servers
served.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import httpx
import numpy as np

from joynexus.bench.server_procs import RssSampler, Server, running_servers
from joynexus.bench.serving_report import print_report
from joynexus.metrics.stages import PER_BATCH_STAGES, PREDICT_STAGES
from joynexus.server.config import DEFAULT_SERVE_MAX_WAIT_MS
from joynexus.utils.affinity import available_cores
from joynexus.wire import MSGPACK_MEDIA_TYPE, packb

if TYPE_CHECKING:
    from joynexus.models.tiny import TinySize

__all__ = ["print_report", "run_serving_bench"]

IMAGE_SIZE = 32
STATE_DIM = 4  # reach2d's state
#: ``size="real"``: :mod:`joynexus.bench.real_models`'s configurations.
REAL_SIZE = "real"
#: The baseline's memory budget at real size (one copy is 1.5-2 GB): what fits a
#: shared CPU box beside the bench and the other processes.
REAL_MEMORY_BUDGET_MB = 7000.0
#: At real size: a request's and a server start's time limit (a batch of real-size
#: forwards takes minutes on a loaded CPU).
REAL_TIMEOUT_S = 1800.0


def _custom_spec(tenant: str, model: str) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "task": "custom",
        "base_model": {"id": model},
        "env": {"kind": "reach2d", "num_envs": 2, "image_size": IMAGE_SIZE},
        "algorithm": {"name": "reinforce"},
        "action_module": {"type": "oft", "hidden_dim": 32, "num_blocks": 1},
    }


def _open_tenant(server: Server, tenant: str, model: str | None) -> str:
    """Create ``tenant`` with a ``custom`` slot (a servable policy) of ``model`` (None:
    no slot); its API key."""
    from joynexus.client import Client

    admin = (server.run_dir / "admin.key").read_text().strip()
    with Client(server.url, admin, timeout=300) as c:
        key = str(c.create_tenant(tenant)["api_key"])
    if model is None:
        return key
    with Client(server.url, key, timeout=300) as c:
        st = c.submit(_custom_spec(tenant, model))
        st = c.wait(st.workload_id, states=["running"], timeout_s=600, poll_s=0.1)
        if st.state.value != "running":
            raise RuntimeError(f"tenant {tenant}: workload {st.state.value}: {st.error}")
    return key


def predict_body(seed: int) -> bytes:
    """A msgpack predict body for the bench's tenants (reach2d's schema): one
    ``IMAGE_SIZE``² RGB camera, a ``STATE_DIM`` state, one instruction; ``seed`` picks
    the values."""
    rng = np.random.default_rng(seed)
    obs = {
        "cameras": {"top": rng.integers(0, 255, (1, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)},
        "state": rng.normal(size=(1, STATE_DIM)).astype(np.float32),
        "instructions": ["reach the target"],
    }
    return packb({"observations": obs, "mode": "mean"})


@dataclass
class _Target:
    """One tenant's endpoint: the server it lives on and its key."""

    tenant: str
    url: str
    key: str
    latencies: list[float] = field(default_factory=list)
    errors: int = 0


async def _drive(
    targets: Sequence[_Target],
    clients: int,
    duration_s: float,
    requests: int | None,
    on_start: Callable[[], None] = lambda: None,
    timeout_s: float = 120.0,
) -> float:
    """Closed-loop clients (``clients`` per tenant) until the deadline; elapsed seconds.

    ``on_start`` runs after the untimed warm-up, just before the timed load.
    """
    # One connection pool per closed-loop client: httpx's pool does work per request
    # that grows with the connections it holds (at 64 clients on one pool the bench's
    # own CPU, not the server, set the throughput).
    https = {
        (t.url, t.tenant, c): httpx.AsyncClient(
            base_url=t.url,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )
        for t in targets
        for c in range(clients)
    }
    try:

        async def one(t: _Target, c: int, body: bytes, record: bool) -> None:
            headers = {
                "Authorization": f"Bearer {t.key}",
                "Content-Type": MSGPACK_MEDIA_TYPE,
                "Accept": MSGPACK_MEDIA_TYPE,
            }
            start = time.perf_counter()
            r = await https[t.url, t.tenant, c].post(
                f"/v1/models/{t.tenant}/predict", content=body, headers=headers
            )
            if r.status_code != 200:
                t.errors += 1
            elif record:
                t.latencies.append(time.perf_counter() - start)

        bodies = {t.tenant: predict_body(i) for i, t in enumerate(targets)}
        # Warm up: every client's connection and every tenant's first forward, untimed.
        await asyncio.gather(
            *(one(t, c, bodies[t.tenant], False) for t in targets for c in range(clients))
        )
        for t in targets:
            t.errors = 0
        on_start()
        start = time.perf_counter()
        deadline = start + duration_s

        async def loop(t: _Target, c: int) -> None:
            done = 0
            while time.perf_counter() < deadline and (requests is None or done < requests):
                await one(t, c, bodies[t.tenant], True)
                done += 1

        await asyncio.gather(*(loop(t, c) for t in targets for c in range(clients)))
        return time.perf_counter() - start
    finally:
        for h in https.values():
            await h.aclose()


#: Server-side timings the servers already export on ``/metrics`` (Prometheus text).
_SCRAPED = {
    "batch_s_sum": "joynexus_system_inference_batch_latency_s_sum",
    "batches": "joynexus_system_inference_batch_latency_s_count",
    "rows_sum": "joynexus_system_inference_batch_size_sum",
    "tenants_sum": "joynexus_system_inference_batch_tenants_sum",
}
for _stage in PREDICT_STAGES:
    _SCRAPED[f"{_stage}_s"] = f'joynexus_predict_stage_seconds_total{{stage="{_stage}"}}'
    _SCRAPED[f"{_stage}_n"] = f'joynexus_predict_stage_events_total{{stage="{_stage}"}}'
#: Stages that are the service's own work (not the model's, not waiting: ``http_read``,
#: the wait for a body its client sends after the headers, is the client's time).
OVERHEAD_STAGES = ("http_decode", "admission", "canonicalize", "http_encode")


def _scrape(servers: Sequence[Server]) -> dict[str, float]:
    """The :data:`_SCRAPED` figures summed over the servers (0 where one is missing)."""
    out = dict.fromkeys(_SCRAPED, 0.0)
    names = {v: k for k, v in _SCRAPED.items()}
    for s in servers:
        with suppress(httpx.HTTPError):
            text = httpx.get(f"{s.url}/metrics", timeout=10).text
            for line in text.splitlines():
                name, _, value = line.rpartition(" ")
                if name in names:
                    with suppress(ValueError):
                        out[names[name]] += float(value)
    return out


def _stages(
    before: dict[str, float], after: dict[str, float], lat: np.ndarray, servers: int, elapsed: float
) -> dict[str, Any]:
    """Where a request's time went, from the servers' own stage meters.

    Each stage of :data:`~joynexus.metrics.stages.PREDICT_STAGES` is given in ms per
    request (``<stage>_ms``): per-request stages directly, per-batch stages (lock wait,
    canonicalize, backbone, head) as the batch's time divided by the requests it
    answered, i.e. the device time each request costs. ``overhead_ms`` sums the
    service's own work (HTTP decode and encode, admission, canonicalize: everything but
    the backbone, the heads and waiting, for the queue, the lock or the client's body);
    ``device_ms_per_batch`` is one grouped forward (canonicalize + backbone + heads);
    ``other_ms`` is the rest of the mean client latency (queue and lock wait, the event
    loop, loopback and the client).
    """
    d = {k: after[k] - before[k] for k in _SCRAPED}
    batches = d["batches"]
    device_ms = d["batch_s_sum"] / batches * 1e3 if batches > 0 else float("nan")
    mean_ms = float(lat.mean() * 1e3) if lat.size else float("nan")
    requests = d["admission_n"]
    per_request: dict[str, float] = {}
    per_batch: dict[str, float] = {}
    for stage in PREDICT_STAGES:
        seconds, events = d[f"{stage}_s"], d[f"{stage}_n"]
        per_request[f"{stage}_ms"] = seconds / requests * 1e3 if requests > 0 else float("nan")
        if stage in PER_BATCH_STAGES:
            per_batch[f"{stage}_ms"] = seconds / events * 1e3 if events > 0 else float("nan")
    return {
        "batches": int(batches),
        "requests_metered": int(requests),
        "mean_batch_rows": d["rows_sum"] / batches if batches > 0 else float("nan"),
        "mean_batch_tenants": d["tenants_sum"] / batches if batches > 0 else float("nan"),
        "client_mean_ms": mean_ms,
        "device_ms_per_batch": device_ms,
        "other_ms": mean_ms - device_ms,
        "device_busy_fraction": d["batch_s_sum"] / (elapsed * servers) if elapsed > 0 else 0.0,
        "per_request": per_request,
        "per_batch": per_batch,
        "overhead_ms": sum(per_request[f"{s}_ms"] for s in OVERHEAD_STAGES),
    }


def _side(
    label: str,
    servers: Sequence[Server],
    targets: Sequence[_Target],
    *,
    clients: int,
    duration_s: float,
    requests: int | None,
    alone: bool = True,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """One deployment under the closed-loop load: its figures; with ``alone``, also the
    stages of requests that have the server to themselves (:func:`_alone`)."""
    with RssSampler(servers) as rss:
        idle = rss.sample()
        before: dict[str, float] = {}

        def mark() -> None:
            time.sleep(0.2)  # the warm-up's events delivered first
            before.update(_scrape(servers))

        elapsed = asyncio.run(_drive(targets, clients, duration_s, requests, mark, timeout_s))
    time.sleep(0.2)  # the Metrics Service delivers its events asynchronously
    after = _scrape(servers)
    pss = sum(s.pss() for s in servers)
    alone_stages = _alone(servers, targets[0], after) if alone else None
    lat = np.asarray([x for t in targets for x in t.latencies], dtype=np.float64)
    n = int(lat.size)
    return {
        "deployment": label,
        "servers": len(servers),
        "requests": n,
        "errors": sum(t.errors for t in targets),
        "elapsed_s": elapsed,
        "req_per_s": n / elapsed if elapsed > 0 else 0.0,
        "p50_ms": float(np.percentile(lat, 50) * 1e3) if n else float("nan"),
        "p99_ms": float(np.percentile(lat, 99) * 1e3) if n else float("nan"),
        "rss_idle_mb": idle / 2**20,
        "rss_peak_mb": rss.peak / 2**20,
        "pss_after_mb": pss / 2**20,
        "stages": _stages(before, after, lat, len(servers), elapsed),
        "alone": alone_stages,
        "per_tenant_req_per_s": {
            t.tenant: len(t.latencies) / elapsed if elapsed > 0 else 0.0 for t in targets
        },
    }


#: Requests one client sends one after another after the timed load (:func:`_alone`).
ALONE_REQUESTS = 40


def _alone(servers: Sequence[Server], target: _Target, before: dict[str, float]) -> dict[str, Any]:
    """The stages of requests that have the server to themselves: one client, one tenant,
    one request at a time (batches of one row). Under load, every stage's wall time
    also holds the time its process waited for a core the clients and the other
    processes were using; alone, it is the service's own work."""
    probe = _Target(target.tenant, target.url, target.key)
    elapsed = asyncio.run(_drive([probe], 1, 3600.0, ALONE_REQUESTS))
    time.sleep(0.2)  # the batch figures reach /metrics through the delivery thread
    after = _scrape(servers)
    lat = np.asarray(probe.latencies, dtype=np.float64)
    return {"requests": int(lat.size), **_stages(before, after, lat, len(servers), elapsed)}


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b > 0 else float("nan")


def run_serving_bench(
    *,
    tenants: int = 8,
    clients_per_tenant: int = 2,
    duration_s: float = 20.0,
    requests: int | None = None,
    size: str = "tiny",
    threads: int = 1,
    ours_threads: int | None = None,
    model_dir: Path | None = None,
    canonicalizers: Sequence[str] = ("tensor",),
    front_procs: Sequence[int] | None = None,
    progress: Callable[[str], None] | None = None,
    arch: str = "qwen2_5_vl",
    memory_budget_mb: float | None = None,
) -> dict[str, Any]:
    """Run both deployments one after the other; the figures and ratios (JSON-ready).

    Args:
        tenants: Tenants (baseline: one server each).
        clients_per_tenant: Closed-loop clients per tenant (one request in flight each).
        duration_s: Timed load per deployment (after an untimed warm-up request per client).
        requests: Optional cap of timed requests per client (stops earlier when reached).
        size: ``tiny`` or ``small`` (:func:`joynexus.models.tiny.make_tiny`), or ``real``
            (:func:`joynexus.bench.real_models.build_real`).
        arch: The backbone's architecture (at ``real``: ``smolvla`` or ``qwen2_5_vl``).
        memory_budget_mb: The baseline's servers start only while they fit in this many
            MiB (the rest of its memory computed); default: no cap, but 7000 at ``real``.
        threads: ``OMP_NUM_THREADS`` of every baseline server process.
        ours_threads: ``OMP_NUM_THREADS`` of ours (default: this machine's usable
            cores: the one shared server may use every core, the baseline's servers
            share the same ones).
        model_dir: A saved model to serve instead of building one.
        canonicalizers: Every server's ``--canonicalizer``. One: the result holds that
            run's figures. Several (e.g. ``processor`` then ``tensor``): both deployments
            run once per canonicalizer in this order, in one session, and the result
            keeps each run's figures under ``by_canonicalizer`` (before/after, side by
            side on the same machine state).
        front_procs: Ours' ``--front-procs`` (default: serve's default). Several: ours
            runs once per value against one baseline run; the result's ``ours`` and
            ratios are the first value's, ``by_front_procs`` holds every value's.
    """

    say = progress or (lambda _line: None)
    if not canonicalizers:
        raise ValueError("canonicalizers: expected at least one")
    if memory_budget_mb is None and size == REAL_SIZE:
        memory_budget_mb = REAL_MEMORY_BUDGET_MB
    with _sigterm_exits():
        return _run(
            tenants,
            clients_per_tenant,
            duration_s,
            requests,
            size,
            threads,
            ours_threads or len(available_cores()),
            model_dir,
            list(canonicalizers),
            _fronts(front_procs),
            say,
            arch=arch,
            memory_budget_mb=memory_budget_mb,
        )


def _fronts(front_procs: Sequence[int] | None) -> list[int]:
    from joynexus.server.front.supervisor import default_front_procs

    values = [default_front_procs()] if not front_procs else list(front_procs)
    if any(v < 0 for v in values) or len(set(values)) != len(values):
        raise ValueError(f"front_procs: distinct values >= 0 expected, got {values}")
    return values


@contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C (``finally`` blocks stop the servers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def bye(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, bye)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _pair(
    root: Path,
    names: Sequence[str],
    model: str,
    threads: int,
    ours_threads: int,
    canonicalizer: str,
    fronts: Sequence[int],
    load: dict[str, Any],
    say: Callable[[str], None],
    memory_budget_mb: float | None = None,
) -> dict[str, Any]:
    """Ours (once per ``fronts`` value), then the baseline, every server with
    ``--canonicalizer canonicalizer`` (as many baseline servers as fit
    ``memory_budget_mb``, the rest computed)."""
    # The servers' queue deadline is the clients' request timeout: at real size one
    # grouped forward can outlast serve's default 60 s on a CPU.
    args = ["--canonicalizer", canonicalizer, "--predict-deadline-s", str(load["timeout_s"])]
    tenants = len(names)
    ours_runs: dict[int, dict[str, Any]] = {}
    for n in fronts:
        say(f"ours ({canonicalizer}, {n} front procs): one server, {tenants} tenants")
        ours_args = [*args, "--front-procs", str(n)]
        with running_servers(
            root / f"ours-f{n}", ["server"], model, ours_threads, ours_args, load["timeout_s"]
        ) as (server,):
            targets = [_Target(t, server.url, _open_tenant(server, t, model)) for t in names]
            say(f"ours: {tenants}x{load['clients']} clients for {load['duration_s']:g} s")
            ours_runs[n] = {"front_procs": n, **_side("ours", [server], targets, **load)}

    fit = baseline_fit(tenants, ours_runs[fronts[0]]["rss_peak_mb"], memory_budget_mb)
    measured = names[:fit]
    say(f"baseline ({canonicalizer}): {fit} of {tenants} single-policy servers")
    base_args = [*args, "--front-procs", "0"]
    with running_servers(
        root / "baseline", measured, model, threads, base_args, load["timeout_s"]
    ) as servers:
        targets = [
            _Target(t, s.url, _open_tenant(s, t, model))
            for t, s in zip(measured, servers, strict=True)
        ]
        say(f"baseline: {fit}x{load['clients']} clients for {load['duration_s']:g} s")
        base = _side("baseline", servers, targets, **load)
    base.update(baseline_computed(base, tenants))
    variants = {str(n): _versus(ours, base) for n, ours in ours_runs.items()}
    out = {**variants[str(fronts[0])], "baseline": base}
    if len(fronts) > 1:
        out["by_front_procs"] = variants
    return out


def baseline_fit(tenants: int, per_server_mb: float, budget_mb: float | None) -> int:
    """How many single-policy servers the baseline starts: every tenant's, or as many
    as ``budget_mb`` holds at ``per_server_mb`` each (at least one)."""
    if budget_mb is None or per_server_mb <= 0:
        return tenants
    return max(1, min(tenants, int(budget_mb // per_server_mb)))


def baseline_computed(base: dict[str, Any], tenants: int) -> dict[str, Any]:
    """The baseline's memory for one server per tenant: measured when every tenant's
    server ran, else computed from the measured servers' mean (flagged ``computed``)."""
    servers = int(base["servers"])
    per_rss, per_pss = base["rss_peak_mb"] / servers, base["pss_after_mb"] / servers
    return {
        "tenants": tenants,
        "computed": servers < tenants,
        "rss_peak_mb_per_server": per_rss,
        "rss_peak_mb_all_tenants": per_rss * tenants,
        "pss_after_mb_all_tenants": per_pss * tenants,
    }


def _versus(ours: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    base_rss = base.get("rss_peak_mb_all_tenants", base["rss_peak_mb"])
    base_pss = base.get("pss_after_mb_all_tenants", base["pss_after_mb"])
    return {
        "ours": ours,
        "throughput_ratio": _ratio(ours["req_per_s"], base["req_per_s"]),
        "memory_ratio": _ratio(base_rss, ours["rss_peak_mb"]),
        "memory_ratio_pss": _ratio(base_pss, ours["pss_after_mb"]),
        "p99_ratio": _ratio(ours["p99_ms"], base["p99_ms"]),
        "p50_ratio": _ratio(ours["p50_ms"], base["p50_ms"]),
    }


def build_model(arch: str, size: str, out: Path) -> Path:
    """The served backbone: a tiny/small model, or a real-size one built in a child
    process (:func:`joynexus.bench.real_models.build_real_isolated`)."""
    if size == REAL_SIZE:
        from joynexus.bench.real_models import build_real_isolated

        return build_real_isolated(arch, out)
    from joynexus.models.tiny import make_tiny

    return make_tiny(arch, out, size=cast("TinySize", size), seed=0)


def model_mb(model_dir: Path) -> float:
    """The saved weights' size in MiB (the backbone a server holds resident)."""
    from joynexus.bench.real_models import model_bytes

    return model_bytes(model_dir) / 2**20


def _run(
    tenants: int,
    clients_per_tenant: int,
    duration_s: float,
    requests: int | None,
    size: str,
    threads: int,
    ours_threads: int,
    model_dir: Path | None,
    canonicalizers: list[str],
    fronts: list[int],
    say: Callable[[str], None],
    *,
    arch: str = "qwen2_5_vl",
    memory_budget_mb: float | None = None,
) -> dict[str, Any]:
    names = [f"t{i}" for i in range(tenants)]
    load_1m = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    # At real size one request takes seconds on a CPU: no requests-alone pass after it.
    load = {
        "clients": clients_per_tenant,
        "duration_s": duration_s,
        "requests": requests,
        "alone": size != REAL_SIZE,
        "timeout_s": REAL_TIMEOUT_S if size == REAL_SIZE else 120.0,
    }
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="joynexus-bench-serving-") as tmp:
        root = Path(tmp)
        if model_dir is None:
            say(f"building the {size} {arch} model")
            model_dir = build_model(arch, size, root / "model")
        backbone_mb = model_mb(model_dir)
        for kind in canonicalizers:
            runs[kind] = _pair(
                root / kind,
                names,
                str(model_dir),
                threads,
                ours_threads,
                kind,
                fronts,
                load,
                say,
                memory_budget_mb,
            )

    config = {
        "tenants": tenants,
        "clients_per_tenant": clients_per_tenant,
        "duration_s": duration_s,
        "requests_per_client": requests,
        "size": size,
        "arch": arch,
        "backbone_weights_mb": backbone_mb,
        "memory_budget_mb": memory_budget_mb,
        "threads_per_server": threads,
        "ours_threads": ours_threads,
        "observation": f"1 x {IMAGE_SIZE}x{IMAGE_SIZE} camera + state[{STATE_DIM}]",
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_start": load_1m,
        "load_avg_1m_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "canonicalizers": canonicalizers,
        "front_procs": fronts,
        # Every server's Inference Queue window: serve's default, which the bench keeps.
        "max_wait_ms": DEFAULT_SERVE_MAX_WAIT_MS,
    }
    if len(runs) == 1:
        return {"config": config, **runs[canonicalizers[0]]}
    return {"config": config, "by_canonicalizer": runs}
