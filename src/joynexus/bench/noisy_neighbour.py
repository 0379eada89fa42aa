"""``joynexus bench serving --scenario noisy-neighbour``: one tenant's load against another's.

One ``joynexus serve`` deployment (serve's defaults, as :mod:`joynexus.bench.serving`
starts it) serves two tenants over HTTP:

* **victim**: one closed-loop client sending one-row ``predict`` requests, as a robot
  does;
* **flooder**: closed-loop clients sending large ``predict`` requests (several rows
  each), within the tenant's request-rate quota.

Phases, one after the other on the same server: *quiet* (the victim alone), then one
*flood* phase per ``floods`` entry (the victim beside the flooder's clients). Each
flood phase reports the victim's p50 / p99 beside its quiet ones
(``p99_vs_quiet`` = flood p99 ÷ quiet p99; issue 43's target is ≤ 3) and what the
flooder got (req/s, rows/s, refusals). Last, the *get_data* phase: a third tenant
puts ``get_data_mib`` MiB of samples in a partition and reads them all back with
``get_data_concurrency`` JSON ``get_data`` calls at once; it reports each call's
status and answer bytes, the size of its request body, and the server's RSS before
and at peak (sampled every 50 ms).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import httpx
import numpy as np

from joynexus.bench.server_procs import RssSampler, Server, running_servers
from joynexus.bench.serving import IMAGE_SIZE, STATE_DIM, _open_tenant
from joynexus.wire import MSGPACK_MEDIA_TYPE, packb

if TYPE_CHECKING:
    from joynexus.models.tiny import TinySize

__all__ = ["DEFAULT_FLOODS", "run_noisy_neighbour_bench"]

#: (clients, rows per predict) of each flood phase: the issue's two probes, a flood of
#: 64-row predicts and one client sending 256-row predicts back to back.
DEFAULT_FLOODS: tuple[tuple[int, int], ...] = ((4, 64), (1, 256))
#: A sample of the get_data phase: 256 KiB of float32.
_SAMPLE_FLOATS = 65_536


def predict_rows_body(rows: int, seed: int) -> bytes:
    """A msgpack predict body of ``rows`` observations in the bench tenants' schema."""
    rng = np.random.default_rng(seed)
    obs = {
        "cameras": {"top": rng.integers(0, 255, (rows, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)},
        "state": rng.normal(size=(rows, STATE_DIM)).astype(np.float32),
        "instructions": ["reach the target"] * rows,
    }
    return packb({"observations": obs, "mode": "mean"})


@dataclass
class _Client:
    """One tenant's closed-loop traffic and what it got."""

    tenant: str
    key: str
    body: bytes
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)


def _headers(key: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {key}",
        "Content-Type": MSGPACK_MEDIA_TYPE,
        "Accept": MSGPACK_MEDIA_TYPE,
    }


async def _load(url: str, loops: Sequence[tuple[_Client, int]], duration_s: float) -> float:
    """``clients`` closed loops per entry until the deadline (after one untimed request
    each); the elapsed seconds."""
    async with httpx.AsyncClient(
        base_url=url,
        timeout=120,
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
    ) as http:

        async def one(c: _Client, record: bool) -> None:
            start = time.perf_counter()
            r = await http.post(
                f"/v1/models/{c.tenant}/predict", content=c.body, headers=_headers(c.key)
            )
            if record:
                c.statuses[r.status_code] = c.statuses.get(r.status_code, 0) + 1
                if r.status_code == 200:
                    c.latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(one(c, False) for c, n in loops for _ in range(n)))
        start = time.perf_counter()
        deadline = start + duration_s

        async def loop(c: _Client) -> None:
            while time.perf_counter() < deadline:
                await one(c, True)

        await asyncio.gather(*(loop(c) for c, n in loops for _ in range(n)))
        return time.perf_counter() - start


def _percentiles(latencies: Sequence[float]) -> dict[str, Any]:
    lat = np.asarray(latencies, dtype=np.float64)
    if not lat.size:
        return {"requests": 0, "p50_ms": float("nan"), "p99_ms": float("nan")}
    return {
        "requests": int(lat.size),
        "p50_ms": float(np.percentile(lat, 50) * 1e3),
        "p99_ms": float(np.percentile(lat, 99) * 1e3),
        "max_ms": float(lat.max() * 1e3),
    }


def _flood_phase(
    server: Server,
    victim: str,
    flooder: str,
    clients: int,
    rows: int,
    duration_s: float,
    quiet_p99_ms: float,
) -> dict[str, Any]:
    v = _Client("victim", victim, predict_rows_body(1, 0))
    f = _Client("flooder", flooder, predict_rows_body(rows, 1))
    elapsed = asyncio.run(_load(server.url, [(v, 1), (f, clients)], duration_s))
    out = _percentiles(v.latencies)
    served = len(f.latencies)
    return {
        "flood_clients": clients,
        "flood_rows": rows,
        "victim": out,
        "victim_statuses": v.statuses,
        "p99_vs_quiet": out["p99_ms"] / quiet_p99_ms if quiet_p99_ms > 0 else float("nan"),
        "flooder": {
            **_percentiles(f.latencies),
            "req_per_s": served / elapsed if elapsed > 0 else 0.0,
            "rows_per_s": served * rows / elapsed if elapsed > 0 else 0.0,
            "statuses": f.statuses,
        },
    }


async def _read_all(url: str, key: str, body: bytes, concurrency: int) -> list[dict[str, Any]]:
    """``concurrency`` JSON get_data calls at once; each one's status and answer bytes
    (streamed and dropped: the bench holds none of them)."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:

        async def one() -> dict[str, Any]:
            size = 0
            refusal = b""
            async with http.stream(
                "POST", "/v1/queue/partitions/bulk/get_data", content=body, headers=headers
            ) as r:
                async for chunk in r.aiter_bytes():
                    size += len(chunk)
                    if r.status_code != 200:
                        refusal += chunk
            out: dict[str, Any] = {"status": r.status_code, "answer_bytes": size}
            if refusal:  # an error body: its code and reason
                err = json.loads(refusal)
                out["code"] = err.get("code")
                out["reason"] = err.get("details", {}).get("reason")
            return out

        return list(await asyncio.gather(*(one() for _ in range(concurrency))))


def _get_data_phase(server: Server, key: str, mib: int, concurrency: int) -> dict[str, Any]:
    """Fill a partition with ``mib`` MiB, then read it all back ``concurrency`` times at once."""
    from joynexus.client import Client

    rows = max(1, mib * 2**20 // (_SAMPLE_FLOATS * 4))
    per_put = 64  # 16 MiB per put: under every body and tensor bound
    with Client(server.url, key, timeout=120) as c:
        for start in range(0, rows, per_put):
            n = min(per_put, rows - start)
            c.queue_put(
                "bulk",
                {"x": np.ones((n, _SAMPLE_FLOATS), dtype=np.float32)},
                {"schema_signature": "bench"},
            )
    body = json.dumps({"indexes": list(range(rows)), "fields": ["x"]}).encode()
    with RssSampler([server], period_s=0.05) as rss:
        idle = rss.sample()
        calls = asyncio.run(_read_all(server.url, key, body, concurrency))
    return {
        "stored_mib": rows * _SAMPLE_FLOATS * 4 / 2**20,
        "request_body_bytes": len(body),
        "concurrency": concurrency,
        "calls": calls,
        "answered": sum(c["status"] == 200 for c in calls),
        "answer_mib_max": max(c["answer_bytes"] for c in calls) / 2**20,
        "rss_before_mb": idle / 2**20,
        "rss_peak_mb": rss.peak / 2**20,
        "rss_growth_mb": (rss.peak - idle) / 2**20,
    }


def run_noisy_neighbour_bench(
    *,
    duration_s: float = 10.0,
    floods: Sequence[tuple[int, int]] = DEFAULT_FLOODS,
    size: str = "tiny",
    ours_threads: int | None = None,
    model_dir: Path | None = None,
    front_procs: int | None = None,
    tenant_batch_rows: int | None = None,
    get_data_mib: int = 150,
    get_data_concurrency: int = 4,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The scenario of the module docstring on one server; the figures (JSON-ready).

    Args:
        duration_s: Timed load of each predict phase.
        floods: (clients, rows per predict) of each flood phase.
        size: ``tiny`` or ``small`` (:func:`joynexus.models.tiny.make_tiny`).
        ours_threads: ``OMP_NUM_THREADS`` of the server (default: the usable cores).
        model_dir: A saved model to serve instead of building one.
        front_procs: The server's ``--front-procs`` (default: serve's).
        tenant_batch_rows: The server's ``--tenant-batch-rows``, C (default: serve's).
        get_data_mib: MiB the get_data phase stores and each of its calls reads (0:
            no get_data phase).
        get_data_concurrency: get_data calls sent at once.

    Raises:
        ValueError: a flood of fewer than one client or row.
    """
    from joynexus.models.tiny import make_tiny
    from joynexus.utils.affinity import available_cores

    if any(c < 1 or r < 1 for c, r in floods):
        raise ValueError(f"floods: (clients, rows) of at least 1 each expected, got {floods}")
    say = progress or (lambda _line: None)
    threads = ours_threads or len(available_cores())
    args = [] if front_procs is None else ["--front-procs", str(front_procs)]
    if tenant_batch_rows is not None:
        args += ["--tenant-batch-rows", str(tenant_batch_rows)]
    with tempfile.TemporaryDirectory(prefix="joynexus-bench-noisy-") as tmp:
        root = Path(tmp)
        if model_dir is None:
            say(f"building the {size} qwen2_5_vl model")
            model_dir = make_tiny("qwen2_5_vl", root / "model", size=cast("TinySize", size), seed=0)
        model = str(model_dir)
        with running_servers(root, ["server"], model, threads, args) as (server,):
            victim = _open_tenant(server, "victim", model)
            flooder = _open_tenant(server, "flooder", model)
            say(f"quiet: the victim alone for {duration_s:g} s")
            quiet_client = _Client("victim", victim, predict_rows_body(1, 0))
            asyncio.run(_load(server.url, [(quiet_client, 1)], duration_s))
            quiet = _percentiles(quiet_client.latencies)
            phases = []
            for clients, rows in floods:
                say(f"flood: {clients} client(s) x {rows}-row predicts beside the victim")
                phases.append(
                    _flood_phase(
                        server, victim, flooder, clients, rows, duration_s, quiet["p99_ms"]
                    )
                )
            get_data = None
            if get_data_mib > 0:
                say(f"get_data: {get_data_concurrency} x {get_data_mib} MiB at once (JSON)")
                reader = _open_tenant(server, "reader", None)
                get_data = _get_data_phase(server, reader, get_data_mib, get_data_concurrency)
    return {
        "config": {
            "scenario": "noisy-neighbour",
            "size": size,
            "arch": "qwen2_5_vl",
            "duration_s": duration_s,
            "floods": [list(f) for f in floods],
            "ours_threads": threads,
            "front_procs": front_procs,
            "tenant_batch_rows": tenant_batch_rows,
            "observation": f"1 x {IMAGE_SIZE}x{IMAGE_SIZE} camera + state[{STATE_DIM}]",
            "cpu_count": os.cpu_count(),
            "load_avg_1m_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        },
        "quiet": quiet,
        "floods": phases,
        "get_data": get_data,
    }
