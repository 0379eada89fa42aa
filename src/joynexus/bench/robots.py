"""``joynexus bench robots``: openpi robot clients against JoyNexus vs openpi's server model.

One JoyNexus (tiny backbone, in this process) serves ``tenants`` tenants, each a
``custom`` slot with LIBERO's observation keys. ``robots`` robot loops built on the real
``openpi_client.WebsocketClientPolicy`` (run by the openpi client venv's python,
:mod:`.openpi_robots`) connect round-robin with the tenants' keys and each send
``requests`` decisions one after the other, twice:

* **sequential** — openpi's server model: its ``WebsocketPolicyServer`` calls
  ``policy.infer`` inline in its event loop, so one request is answered at a time
  whatever the number of connections. Here: the same policies behind an
  :class:`~joynexus.server.openpi.OpenPIGateway` with ``sequential=True`` (one lock
  around every predict), started by the bench on its own port.
* **joynexus** — the gateway of ``joynexus serve --openpi-port``: every request awaits
  the Master's ``predict``, so requests of all robots and tenants are group-batched
  in the Inference Queue.
* **joynexus-fronts-N** (``front_procs``, once per value) — a real ``joynexus serve
  --front-procs N --openpi-port P`` process: the robots' frames are decoded and
  validated, and the answers encoded, in its N front processes (none with 0), the
  model process only batching and running the model. Its figures come from its
  ``/metrics``.

Reported per side: actions/s (actions received over the wall time from the common
start to the last answer), requests/s, p50 / p99 latency per robot and over all, the
Inference Queue's mean batch size; and the ratios joynexus / sequential.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import uvicorn
from rich.console import Console
from rich.table import Table

from joynexus.bench.server_procs import free_port, running_servers
from joynexus.interop.venvs import side_python
from joynexus.runtime.hosting import InProcess, RuntimeConfig
from joynexus.server.auth import TenantStore
from joynexus.server.openpi import OPENPI, OpenPIGateway, openpi_app
from joynexus.server.openpi.app import serve_together
from joynexus.server.serve import build_live_app, build_plane
from joynexus.spec.workload import BaseModelSpec
from joynexus.utils.affinity import available_cores

__all__ = [
    "OPENPI_VENV_ENV",
    "openpi_python",
    "print_report",
    "run_robots_bench",
    "serving",
]

#: Where the openpi client venv is, when not ``.venv-openpi`` next to the project.
OPENPI_VENV_ENV = "JOYNEXUS_OPENPI_VENV"
DRIVER = Path(__file__).with_name("openpi_robots.py")
STATE_DIM = 8
ACTION_DIM = 7
CHUNK = 8


def openpi_python() -> Path:
    """The python of the openpi client venv (``make install`` builds ``.venv-openpi``):
    ``$JOYNEXUS_OPENPI_VENV``, else ``.venv-openpi`` in the checkout or next to the venv."""
    return side_python(".venv-openpi", OPENPI_VENV_ENV)


@contextmanager
def serving(apps: list[tuple[Any, Literal["on", "off"]]]) -> Iterator[list[int]]:
    """Serve ASGI apps (each with its lifespan mode) on 127.0.0.1 and ephemeral ports, in
    ONE event loop in a thread — the openpi gateways await the Master's Inference Queue,
    which lives on the loop of the main app — and yield their ports."""
    servers = [
        uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan=mode)
        )
        for app, mode in apps
    ]
    thread = threading.Thread(
        target=lambda: asyncio.run(serve_together(*servers)), daemon=True, name="bench-servers"
    )
    thread.start()
    deadline = time.monotonic() + 120
    while not all(s.started for s in servers):
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("a bench server did not start")
        time.sleep(0.02)
    try:
        yield [int(s.servers[0].sockets[0].getsockname()[1]) for s in servers]
    finally:
        for s in servers:
            s.should_exit = True
        thread.join(timeout=60)


def _open_tenants(base: str, admin: str, model: str, tenants: int, image: int) -> list[str]:
    keys = []
    quotas = {"requests_per_s": 1e6, "burst": 1_000_000}  # the bench measures serving
    with httpx.Client(base_url=base, timeout=120) as http:
        wids = []
        for t in range(tenants):
            tenant = f"robot-{t}"
            r = http.post(
                "/v1/tenants",
                json={"tenant_id": tenant, "quotas": quotas},
                headers={"Authorization": f"Bearer {admin}"},
            )
            r.raise_for_status()
            key = str(r.json()["api_key"])
            camera = {"height": image, "width": image}
            spec = {
                "tenant": tenant,
                "task": "custom",
                "base_model": {"id": model},
                "schema": {
                    "name": "libero",
                    "cameras": {"image": camera, "wrist_image": camera},
                    "state_dim": STATE_DIM,
                    "action_dim": ACTION_DIM,
                    "action_chunk": CHUNK,
                },
                "action_module": {"type": "oft", "hidden_dim": 64, "num_blocks": 1},
            }
            r = http.post("/v1/workloads", json=spec, headers={"Authorization": f"Bearer {key}"})
            r.raise_for_status()
            keys.append(key)
            wids.append(r.json()["workload_id"])
        for key, wid in zip(keys, wids, strict=True):
            auth = {"Authorization": f"Bearer {key}"}
            deadline = time.monotonic() + 300
            while http.get(f"/v1/workloads/{wid}/status", headers=auth).json()["state"] != (
                "running"
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"workload {wid} did not start")
                time.sleep(0.05)
    return keys


def _drive(python: Path, port: int, keys: list[str], cfg: dict[str, Any], tmp: Path) -> Any:
    path = tmp / f"robots-{port}.json"
    path.write_text(json.dumps({**cfg, "url": f"ws://127.0.0.1:{port}", "keys": keys}))
    run = subprocess.run(
        [str(python), str(DRIVER), str(path)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if run.returncode != 0:
        raise RuntimeError(f"the openpi robot clients failed:\n{run.stderr[-3000:]}")
    out = json.loads(run.stdout)
    if out["errors"]:
        raise RuntimeError("robot errors: " + "; ".join(out["errors"][:4]))
    return out


def _side(raw: dict[str, Any], batches: tuple[int, int]) -> dict[str, Any]:
    per_robot = []
    every: list[float] = []
    for i, robot in enumerate(raw["robots"]):
        lat = np.asarray(robot["latencies_ms"])
        every += robot["latencies_ms"]
        per_robot.append(
            {
                "robot": i,
                "tenant": robot["tenant"],
                "p50_ms": float(np.percentile(lat, 50)),
                "p99_ms": float(np.percentile(lat, 99)),
                "actions": robot["actions"],
            }
        )
    actions = sum(r["actions"] for r in raw["robots"])
    requests = len(every)
    wall = float(raw["wall_s"])
    samples, count = batches
    return {
        "wall_s": wall,
        "actions": actions,
        "requests": requests,
        "actions_per_s": actions / wall,
        "requests_per_s": requests / wall,
        "p50_ms": float(np.percentile(every, 50)),
        "p99_ms": float(np.percentile(every, 99)),
        "worst_robot_p99_ms": max(r["p99_ms"] for r in per_robot),
        "mean_batch_size": samples / count if count else 0.0,
        "per_robot": per_robot,
    }


def run_robots_bench(
    *,
    robots: int = 8,
    tenants: int = 4,
    requests: int = 30,
    warmup: int = 2,
    image_size: int = 224,
    model: str = "tiny:qwen2_5_vl",
    client_python: Path | None = None,
    front_procs: Sequence[int] = (),
) -> dict[str, Any]:
    """Run every side (see module docstring) and return the report.

    Args:
        front_procs: One ``joynexus serve`` process per value, with that many front
            processes; each side's ratios to the sequential server are in
            ``by_front_procs``.
    """
    python = client_python or openpi_python()
    if not python.is_file():
        raise RuntimeError(
            f"no openpi client venv at {python.parent.parent}: build it with "
            "`bash scripts/install-python-extras.sh .venv/bin/python` (make install does), "
            f"or point ${OPENPI_VENV_ENV} at one holding openpi-client"
        )
    cfg = {
        "robots": robots,
        "requests": requests,
        "warmup": warmup,
        "image_size": image_size,
        "state_dim": STATE_DIM,
    }
    with tempfile.TemporaryDirectory(prefix="joynexus-robots-") as tmpdir:
        tmp = Path(tmpdir)
        plane = build_plane(
            tmp / "run", BaseModelSpec(id=model), placement=InProcess(), config=RuntimeConfig()
        )
        store = TenantStore.in_memory()
        admin = store.create_admin_key().api_key
        live = build_live_app(plane, store, output_root=tmp / "run" / "outputs")
        state = live.app.state.joynexus
        batched = openpi_app(state, state.service(OPENPI))
        sequential = openpi_app(state, OpenPIGateway(sequential=True))
        try:
            with serving([(live.app, "on"), (batched, "off"), (sequential, "off")]) as ports:
                main_port, batched_port, sequential_port = ports
                keys = _open_tenants(
                    f"http://127.0.0.1:{main_port}", admin, model, tenants, image_size
                )
                sides: dict[str, Any] = {}
                for name, port in (("sequential", sequential_port), ("joynexus", batched_port)):
                    before, stages0 = _batches(plane), _stages(plane)
                    raw = _drive(python, port, keys, cfg, tmp)
                    after, stages1 = _batches(plane), _stages(plane)
                    sides[name] = _side(raw, (after[0] - before[0], after[1] - before[1]))
                    sides[name]["stage_s"] = {
                        k: round(v - stages0.get(k, 0.0), 4) for k, v in stages1.items()
                    }
        finally:
            live.host.close()
        for n in front_procs:
            sides[f"joynexus-fronts-{n}"] = _served(python, model, tenants, image_size, cfg, tmp, n)
    seq, jnx = sides["sequential"], sides["joynexus"]
    served = {
        str(n): {
            "actions_per_s_ratio": sides[f"joynexus-fronts-{n}"]["actions_per_s"]
            / seq["actions_per_s"],
            "p99_ratio": sides[f"joynexus-fronts-{n}"]["p99_ms"] / seq["p99_ms"],
        }
        for n in front_procs
    }
    return {
        "robots": robots,
        "tenants": tenants,
        "requests_per_robot": requests,
        "image_size": image_size,
        "action_chunk": CHUNK,
        "model": model,
        "cpus": os.cpu_count(),
        "sequential": seq,
        "joynexus": jnx,
        "actions_per_s_ratio": jnx["actions_per_s"] / seq["actions_per_s"],
        "p99_ratio": jnx["p99_ms"] / seq["p99_ms"],
        **{k: v for k, v in sides.items() if k.startswith("joynexus-fronts-")},
        **({"by_front_procs": served} if served else {}),
    }


def _served(
    python: Path,
    model: str,
    tenants: int,
    image_size: int,
    cfg: dict[str, Any],
    tmp: Path,
    fronts: int,
) -> dict[str, Any]:
    """The robots against a ``joynexus serve --front-procs fronts --openpi-port`` process,
    with every core for its model (as the in-process sides have)."""
    port = free_port()
    args = ["--front-procs", str(fronts), "--openpi-port", str(port)]
    threads = len(available_cores())
    with running_servers(tmp / f"served-f{fronts}", ["server"], model, threads, args) as (server,):
        admin = (server.run_dir / "admin.key").read_text().strip()
        keys = _open_tenants(server.url, admin, model, tenants, image_size)
        before = _scraped(server.url)
        raw = _drive(python, port, keys, cfg, tmp)
        rows = cfg["robots"] * (cfg["requests"] + cfg["warmup"])  # one row a decision
        after = _settled(server.url, before, rows)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    side = _side(raw, (int(delta.pop("samples", 0)), int(delta.pop("batches", 0))))
    side["stage_s"] = {k: round(v, 4) for k, v in delta.items()}
    side["front_procs"] = fronts
    return side


#: How long a served side's batch meters may take to count its last answers.
SETTLE_S = 30.0
_STAGE = re.compile(r'^joynexus_predict_stage_seconds_total\{stage="(\w+)"\} (\S+)$')
_BATCHES = {
    "joynexus_system_inference_batch_size_sum": "samples",
    "joynexus_system_inference_batch_latency_s_count": "batches",
}


def _settled(url: str, before: dict[str, float], rows: int) -> dict[str, float]:
    """The server's figures once its batch meters count ``rows`` more rows than
    ``before`` (they reach ``/metrics`` through the Metrics Service's delivery thread, a
    moment after the answers), or as they are after ``SETTLE_S``."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        after = _scraped(url)
        if after.get("samples", 0.0) - before.get("samples", 0.0) >= rows:
            return after
        if time.monotonic() > deadline:
            return after
        time.sleep(0.1)


def _scraped(url: str) -> dict[str, float]:
    """A server's rows and batches so far, and its seconds per predict stage."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        stage = _STAGE.match(line)
        name, _, value = line.rpartition(" ")
        if stage is not None:
            out[stage.group(1)] = float(stage.group(2))
        elif name in _BATCHES:
            out[_BATCHES[name]] = float(value)
    return out


def _batches(plane: Any) -> tuple[int, int]:
    """(samples, batches) the Inference Queue has run so far."""
    m = plane.inference.metrics
    hist: dict[int, int] = m.batch_size_histogram
    return sum(k * v for k, v in hist.items()), sum(hist.values())


def _stages(plane: Any) -> dict[str, float]:
    """Seconds spent so far per predict stage (queue wait, backbone, head, ...)."""
    stages = getattr(plane.metrics, "stages", None)
    if stages is None:
        return {}
    return {k: float(total) for k, (total, _count) in stages.snapshot().items()}


def print_report(result: dict[str, Any], console: Console) -> None:
    table = Table(
        "server", "actions/s", "requests/s", "p50 ms", "p99 ms", "worst robot p99", "mean batch"
    )
    names = [
        "sequential",
        "joynexus",
        *(f"joynexus-fronts-{n}" for n in result.get("by_front_procs", {})),
    ]
    for name in names:
        s = result[name]
        table.add_row(
            name,
            f"{s['actions_per_s']:.1f}",
            f"{s['requests_per_s']:.1f}",
            f"{s['p50_ms']:.1f}",
            f"{s['p99_ms']:.1f}",
            f"{s['worst_robot_p99_ms']:.1f}",
            f"{s['mean_batch_size']:.2f}",
        )
    console.print(table)
    console.print(
        f"{result['robots']} robots, {result['tenants']} tenants: joynexus / sequential "
        f"actions/s = {result['actions_per_s_ratio']:.2f}x (higher is better), "
        f"p99 = {result['p99_ratio']:.2f}x (lower is better)"
    )
    for n, r in result.get("by_front_procs", {}).items():
        console.print(
            f"joynexus serve with {n} front process(es) / sequential: actions/s = "
            f"{r['actions_per_s_ratio']:.2f}x, p99 = {r['p99_ratio']:.2f}x"
        )
