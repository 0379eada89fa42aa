"""``joynexus serve`` and the client commands that talk to a running server.

``serve`` hosts the HTTP API with a live Master Service on one set of services. The
other commands (``tenants create|list``, ``submit``, ``logs``, ``artifacts``,
``export``; ``status``, ``pause``, ``resume``, ``cancel`` and ``load-weights`` are in
:mod:`joynexus.cli.workloads`) go through :class:`joynexus.client.Client`, with the URL
and key of ``--url`` / ``--api-key`` or ``JOYNEXUS_URL`` / ``JOYNEXUS_API_KEY``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from joynexus.cli.app import app
from joynexus.cli.ports import exit_if_ports_taken
from joynexus.cli.tracking import Tracking, trackers_of
from joynexus.server.config import (
    DEFAULT_SERVE_MAX_WAIT_MS,
    DEFAULT_SERVE_TENANT_BATCH_ROWS,
    RUNTIME_PREDICT_DEADLINE_S,
)

if TYPE_CHECKING:
    from joynexus.client import Client

console = Console()
tenants_app = typer.Typer(help="Tenants and API keys (admin key).", no_args_is_help=True)
app.add_typer(tenants_app, name="tenants")

Url = Annotated[str | None, typer.Option("--url", envvar="JOYNEXUS_URL", help="Server URL.")]
Key = Annotated[str | None, typer.Option("--api-key", envvar="JOYNEXUS_API_KEY", help="API key.")]

#: ``joynexus serve --runtime local``'s bound of the engine pool: in-process engines share
#: one backbone (and its lock), so more of them add batching queues, not throughput.
DEFAULT_LOCAL_MAX_ENGINES = 4


def _client(url: str | None, key: str | None) -> Client:
    from joynexus.client import Client

    return Client(url, key)


def _fail(exc: Exception) -> typer.Exit:
    # One line whatever the width (off a terminal rich assumes 80 columns); the
    # message is text, never markup.
    console.print(
        f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True, emoji=False
    )
    return typer.Exit(1)


@app.command("serve")
def serve(
    runtime: Annotated[
        str, typer.Option(help="local (services in this process) or ray (services as actors).")
    ] = "local",
    address: Annotated[
        str | None,
        typer.Option(
            help="--runtime ray: 'auto' or host:port attaches to a running cluster "
            "(default: start a local one)."
        ),
    ] = None,
    layout: Annotated[
        str,
        typer.Option(
            help="--runtime ray: GPUs per role, actor-inference-environment "
            "('2-2-4', '1-1-2', or a name: shared, isolated, cpu)."
        ),
    ] = "cpu",
    engines: Annotated[
        int, typer.Option(help="Rollout engines at start (scale later with 'joynexus scale').")
    ] = 1,
    max_engines: Annotated[
        int | None,
        typer.Option(
            "--max-engines",
            help="Upper bound of the rollout-engine pool (default: 4 for --runtime local; "
            "one per inference GPU of the layout for --runtime ray).",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    openpi_port: Annotated[
        int | None,
        typer.Option(
            "--openpi-port",
            help="Also serve openpi's websocket policy protocol on this port (robots connect "
            "with openpi_client.WebsocketClientPolicy(host, port, api_key=<tenant key>)); "
            "it is always at ws://HOST:PORT/v1/openpi on the main port too.",
        ),
    ] = None,
    run_dir: Annotated[
        Path, typer.Option("--run-dir", help="Scheduler, tenants, model cache, outputs.")
    ] = Path("runs/joynexus-serve"),
    base_model: Annotated[
        str, typer.Option("--base-model", help="Resident base model (hub id, path, tiny:<arch>).")
    ] = "tiny:qwen2_5_vl",
    device: Annotated[
        str, typer.Option("--device", help="Device of the resident base model (cpu, cuda, cuda:1).")
    ] = "cpu",
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype", help="Weights dtype of the base model: auto, float32, bfloat16, float16."
        ),
    ] = "auto",
    canonicalizer: Annotated[
        str,
        typer.Option(
            "--canonicalizer",
            help="How canonical backbone inputs are made: 'tensor' (default; batched "
            "tensor ops on the model's device, prompt ids cached) or 'processor' (the "
            "Hugging Face processor per image, the reference). Both give the same inputs.",
        ),
    ] = "tensor",
    admin_key_file: Annotated[
        Path | None,
        typer.Option("--admin-key-file", help="Where the admin key is kept (default: run dir)."),
    ] = None,
    dataset_root: Annotated[
        list[Path] | None,
        typer.Option(
            "--dataset-root",
            help="A directory of tenants' SFT datasets, each in its tenant's folder "
            "<root>/<tenant>/ (repeatable; <run-dir>/datasets comes last).",
        ),
    ] = None,
    gym_allow_id: Annotated[
        list[str] | None,
        typer.Option(
            "--gym-allow-id",
            help="A gymnasium id tenants may open with kind: gym (repeatable; default: any "
            "id gymnasium has registered, never a 'module:' id).",
        ),
    ] = None,
    gym_allow_import: Annotated[
        list[str] | None,
        typer.Option(
            "--gym-allow-import",
            help="A module tenants may have the server import for kind: gym (repeatable; "
            "default: none).",
        ),
    ] = None,
    gym_allow_make_kwarg: Annotated[
        list[str] | None,
        typer.Option(
            "--gym-allow-make-kwarg",
            help="A gymnasium.make keyword tenants may pass (repeatable; default: none).",
        ),
    ] = None,
    tenant_memory_gib: Annotated[
        float | None,
        typer.Option(
            "--tenant-memory-gib",
            min=0.0,
            help="Memory all tenants' trainable state (heads, LoRA adapters, optimizer "
            "state) may take; a tenant that does not fit is refused (default: no bound).",
        ),
    ] = None,
    inference_backbone: Annotated[
        str,
        typer.Option(
            "--inference-backbone",
            help="'shared': inference runs on the training role's resident backbone and "
            "the two take turns on it; 'copy': inference gets its own resident copy (one "
            "more backbone of memory) so training steps never block predicts. See "
            "docs/RESULTS.md for what each costs.",
        ),
    ] = "shared",
    recovery_budget: Annotated[
        int,
        typer.Option(
            "--recovery-budget",
            min=0,
            help="Restarts per 10-minute sliding window: of each tenant's simulator "
            "sessions (past it, that tenant's workload fails), of each role (engines, "
            "training; past it, a global restart) and of each workload across global "
            "restarts (past it, the workload fails and /readyz reports degraded).",
        ),
    ] = 3,
    watchdog_factor: Annotated[
        float,
        typer.Option(
            "--watchdog-factor",
            min=1.0,
            help="Flag a running workload 'stalled' after this many expected job times "
            "without progress.",
        ),
    ] = 20.0,
    metrics_auth: Annotated[
        str,
        typer.Option(
            "--metrics-auth",
            help="none: /metrics answers without a key (Prometheus scrapers); "
            "admin: it needs an admin key.",
        ),
    ] = "none",
    tracking: Tracking = None,
    header_timeout: Annotated[
        float,
        typer.Option(
            "--header-timeout", min=0.001, help="Seconds a client has to send request headers."
        ),
    ] = 10.0,
    idle_timeout: Annotated[
        float,
        typer.Option("--idle-timeout", min=0.001, help="Seconds an idle keep-alive lives."),
    ] = 5.0,
    max_connections: Annotated[
        int,
        typer.Option(
            "--max-connections", min=1, help="Open connections; more are closed (503 above)."
        ),
    ] = 512,
    ws_ping_interval: Annotated[
        float,
        typer.Option(
            "--ws-ping-interval",
            min=0.001,
            help="Seconds between the server's pings on an open websocket (robots).",
        ),
    ] = 20.0,
    ws_missed_pings: Annotated[
        int,
        typer.Option(
            "--ws-missed-pings",
            min=1,
            help="Ping intervals a websocket may leave a ping unanswered before it is "
            "closed (a half-open or frozen robot).",
        ),
    ] = 3,
    max_wait_ms: Annotated[
        float,
        typer.Option(
            "--max-wait-ms",
            min=0.0,
            help="T of the Inference Queue's group batching: the longest the oldest "
            "queued predict waits for a fuller batch (0: a batch fires as soon as the "
            "model is free). Closed-loop callers (robots, eval loops) wait out T on every "
            "step; see docs/RESULTS.md for what T costs and gains.",
        ),
    ] = DEFAULT_SERVE_MAX_WAIT_MS,
    predict_deadline_s: Annotated[
        float,
        typer.Option(
            "--predict-deadline-s",
            min=0.001,
            max=86400.0,
            help="Seconds a predict may wait in the Inference Queue before its 504 "
            "(raise it where one grouped forward is that slow: a real-size model on a CPU).",
        ),
    ] = RUNTIME_PREDICT_DEADLINE_S,
    max_batch_size: Annotated[
        int,
        typer.Option(
            "--max-batch-size",
            min=1,
            help="B of the group batching: a batch fires once it holds this many samples.",
        ),
    ] = 128,
    tenant_batch_rows: Annotated[
        int,
        typer.Option(
            "--tenant-batch-rows",
            min=1,
            help="C: the most rows of one tenant in one grouped batch; a larger predict "
            "runs as C-row pieces answered together, so another tenant's request waits at "
            "most one batch holding C of its rows (capped at B). Lower: fairer under a "
            "flood; higher: a lone large predict takes fewer forwards.",
        ),
    ] = DEFAULT_SERVE_TENANT_BATCH_ROWS,
    front_procs: Annotated[
        int | None,
        typer.Option(
            "--front-procs",
            min=0,
            help="Front processes that accept HTTP on the port and decode / encode "
            "predict requests, handing tensors to this process through shared memory "
            "(other routes are forwarded unchanged). Default: usable cores - 1, at least "
            "1; 0: this process does everything.",
        ),
    ] = None,
) -> None:
    """Serve the HTTP API with a live Master Service (workloads can be submitted any time).

    Inference runs on an elastic pool of rollout engines (in this process, or Ray
    actors); an admin scales it while the server runs with ``joynexus scale rollout``.
    """
    if runtime not in ("local", "ray"):
        raise _fail(ValueError(f"--runtime must be 'local' or 'ray', got {runtime!r}"))
    if math.isnan(predict_deadline_s):  # the option's range lets NaN through
        raise typer.BadParameter("not a number", param_hint="--predict-deadline-s")
    deadline_ms = predict_deadline_s * 1e3
    if not math.isfinite(max_wait_ms) or max_wait_ms > deadline_ms:
        # Past the predict deadline a lone request would wait out its deadline (504).
        raise typer.BadParameter(
            f"must be a number of ms from 0 to {deadline_ms:g} (the predict deadline), "
            f"got {max_wait_ms}",
            param_hint="--max-wait-ms",
        )
    exit_if_ports_taken(host, port, openpi_port)  # before anything loads
    trackers = trackers_of(tracking)
    if metrics_auth not in ("none", "admin"):
        raise _fail(ValueError(f"--metrics-auth must be 'none' or 'admin', got {metrics_auth!r}"))
    # One server per run directory, held until this process exits (the kernel drops
    # it on a crash): a second `serve` on it stops here, naming the holder's PID, before
    # anything heavy is imported or loaded.
    from joynexus.errors import JoyNexusError
    from joynexus.utils.rundir_lock import RunDirLock

    try:
        lock = RunDirLock(run_dir).acquire()
    except JoyNexusError as exc:
        raise _fail(exc) from None
    if runtime == "ray":
        try:
            import ray  # noqa: F401
        except ImportError as exc:
            raise _fail(
                RuntimeError(f"--runtime ray needs the 'ray' extra (pip install ray): {exc}")
            ) from exc

    from pydantic import ValidationError

    from joynexus.master.limits import MasterLimits
    from joynexus.master.store import SQLiteWorkloadStore
    from joynexus.runtime.health import HealthManager
    from joynexus.runtime.hosting import EnginePoolPlacement, Placement, RuntimeConfig
    from joynexus.runtime.ray_hosting import RayPlacement
    from joynexus.server.auth import TenantStore
    from joynexus.server.config import ServerConfig
    from joynexus.server.connections import (
        ConnectionLimits,
        install_log_limits,
    )
    from joynexus.server.serve import build_live_app, build_plane, ensure_admin_key
    from joynexus.spec.workload import BaseModelSpec

    try:
        base_spec = BaseModelSpec.model_validate(
            {"id": base_model, "device": device, "dtype": dtype, "canonicalizer": canonicalizer}
        )
    except ValidationError as exc:
        raise _fail(
            ValueError(f"--device / --dtype / --canonicalizer: {exc.errors()[0]['msg']}")
        ) from None
    placement: Placement
    try:
        if runtime == "ray":
            placement = RayPlacement(
                address=address, layout=layout, engines=engines, max_engines=max_engines
            )
        else:
            placement = EnginePoolPlacement(
                engines=engines,
                max_engines=DEFAULT_LOCAL_MAX_ENGINES if max_engines is None else max_engines,
            )
    except JoyNexusError as exc:
        raise _fail(exc) from None

    connection_limits = ConnectionLimits(
        header_timeout_s=header_timeout,
        idle_timeout_s=idle_timeout,
        max_connections=max_connections,
        ws_ping_interval_s=ws_ping_interval,
        ws_missed_pings=ws_missed_pings,
    )
    server_config = ServerConfig(
        gym_allowed_ids=gym_allow_id or None,
        gym_allowed_imports=gym_allow_import or [],
        gym_allowed_make_kwargs=gym_allow_make_kwarg or [],
    )
    # The Training Queue itself is capped too (the Master's own writes), not only the
    # tenants' writes over HTTP.
    knobs = RuntimeConfig(
        max_batch_size=max_batch_size,
        tenant_batch_rows=tenant_batch_rows,
        max_wait_s=max_wait_ms / 1e3,
        predict_deadline_s=predict_deadline_s,
        watchdog_factor=watchdog_factor,
        queue_memory_cap_bytes=server_config.queue_memory_cap_bytes,
        tenant_memory_budget_bytes=None
        if tenant_memory_gib is None
        else int(tenant_memory_gib * 2**30),
        inference_backbone=_inference_backbone(inference_backbone),
    )
    key_file = admin_key_file or run_dir / "admin.key"
    try:  # a lost or damaged tenant store beside existing state is refused
        tenants = TenantStore.open_run_dir(run_dir, admin_key_file=key_file)
    except JoyNexusError as exc:
        raise _fail(exc) from None
    if ensure_admin_key(tenants, key_file):
        console.print(f"admin API key written to [bold]{key_file}[/bold] (mode 0600)")
    else:
        console.print(f"admin API key: [bold]{key_file}[/bold]")
    console.print(f"loading base model {base_model} ...")
    if runtime == "ray":
        where = "a local Ray cluster" if address is None else f"Ray at {address}"
        console.print(f"starting the services as actors on {where} (layout {layout}) ...")
    try:
        # Jobs a killed server left in flight are the Master's to reconcile against
        # the checkpoint ledgers (completed if their update is in a checkpoint).
        plane = build_plane(
            run_dir,
            base_spec,
            placement=placement,
            config=knobs,
            keep_in_flight=True,
        )
    except JoyNexusError as exc:
        raise _fail(exc) from None
    roots = [*(dataset_root or []), run_dir / "datasets"]
    live = build_live_app(
        plane,
        tenants,
        output_root=run_dir / "outputs",
        # Workload records next to the scheduler's jobs: a restarted server resumes them.
        store=SQLiteWorkloadStore(run_dir / "scheduler.sqlite"),
        limits=MasterLimits(dataset_roots=roots),
        config=server_config,
        runtime=knobs,
        # Probes and crash reports only (no heartbeats): a crashed simulator session or a
        # failed rollout engine is restarted in place, the training role from the
        # checkpoints; a spent budget fails the live workloads.
        health=HealthManager(
            default_budget=recovery_budget, heartbeat_timeout_s=None, check_interval_s=1.0
        ),
        metrics_auth="admin" if metrics_auth == "admin" else "none",
    )
    from joynexus.metrics.tracking import subscribe_trackers

    assert plane.metrics is not None  # build_plane always starts the Metrics Service
    try:
        # Closed by the Metrics Service when the server stops.
        sinks = subscribe_trackers(plane.metrics, run_dir, everyone=trackers)
    except JoyNexusError as exc:
        raise _fail(exc) from None
    if sinks:
        console.print(f"learning curves of every tenant also go to: {', '.join(sinks)}")
    base_url = f"http://{host}:{port}"
    console.print(f"serving on {base_url} (OpenAPI at /openapi.json)")
    console.print(
        f"dashboard: [bold]{base_url}/dashboard[/bold] (sign in with an API key, or open "
        f"{base_url}/dashboard#key=<api key>); Prometheus metrics: {base_url}/metrics"
    )
    try:
        # Slow or half-open clients and accept-error storms: see server.connections.
        install_log_limits(connection_limits)
        from joynexus.server.doors import serve_doors
        from joynexus.server.front.supervisor import default_front_procs

        serve_doors(
            live.app,
            host=host,
            port=port,
            openpi_port=openpi_port,
            fronts=default_front_procs() if front_procs is None else front_procs,
            limits=connection_limits,
            say=console.print,
        )
    finally:
        live.host.close()  # workload store, scheduler, Ray actors and placement group
        lock.release()


@tenants_app.command("create")
def tenants_create(tenant_id: str, url: Url = None, api_key: Key = None) -> None:
    """Create a tenant and print its first API key (shown once)."""
    from joynexus.client import APIError

    try:
        with _client(url, api_key) as c:
            out = c.create_tenant(tenant_id)
    except APIError as exc:
        raise _fail(exc) from None
    console.print(f"tenant {tenant_id} created; API key: [bold]{out['api_key']}[/bold]")


@tenants_app.command("list")
def tenants_list(url: Url = None, api_key: Key = None) -> None:
    """List tenants and their quotas."""
    from joynexus.client import APIError

    try:
        with _client(url, api_key) as c:
            rows = c.list_tenants()
    except APIError as exc:
        raise _fail(exc) from None
    table = Table("tenant", "max sessions", "max in-flight jobs", "requests/s")
    for row in rows:
        q = row["quotas"]
        table.add_row(
            row["tenant_id"],
            str(q["max_sessions"]),
            str(q["max_inflight_jobs"]),
            str(q["requests_per_s"]),
        )
    console.print(table)


@app.command("submit")
def submit(
    spec: Annotated[Path, typer.Argument(help="Workload spec (YAML or JSON, one workload).")],
    url: Url = None,
    api_key: Key = None,
) -> None:
    """Submit a workload; prints its id."""
    from joynexus.client import APIError

    try:
        with _client(url, api_key) as c:
            st = c.submit(spec)
    except (APIError, ValueError, OSError) as exc:
        raise _fail(exc) from None
    console.print(f"submitted {st.workload_id} ({st.task}, {st.state.value})")


@app.command("logs")
def logs(
    workload: str,
    kind: Annotated[str | None, typer.Option(help="Only records of this kind.")] = None,
    url: Url = None,
    api_key: Key = None,
) -> None:
    """Print a workload's metrics records (JSON lines)."""
    from joynexus.client import APIError

    try:
        with _client(url, api_key) as c:
            out = c.metrics(workload, kind=kind)
    except APIError as exc:
        raise _fail(exc) from None
    for record in out.records:
        typer.echo(json.dumps(record, sort_keys=True))


@app.command("artifacts")
def artifacts(
    workload: str,
    download: Annotated[str | None, typer.Option(help="Download this artifact path.")] = None,
    out: Annotated[Path | None, typer.Option(help="Where to write the download.")] = None,
    url: Url = None,
    api_key: Key = None,
) -> None:
    """List a workload's artifacts (the tenant's output dir), or download one."""
    from joynexus.client import APIError

    try:
        with _client(url, api_key) as c:
            if download is not None:
                target = out or Path(Path(download).name)
                target.write_bytes(c.download(workload, download))
                console.print(f"wrote {target}")
                return
            rows = c.artifacts(workload)
    except APIError as exc:
        raise _fail(exc) from None
    table = Table("path", "bytes")
    for row in rows:
        table.add_row(row["path"], str(row["size"]))
    console.print(table)


@app.command("export")
def export(
    tenant: str,
    out: Annotated[Path, typer.Option("--out", help="File to write (msgpack).")],
    url: Url = None,
    api_key: Key = None,
) -> None:
    """Export a tenant's action module (named tensors + manifest, msgpack) to a file."""
    from joynexus.client import APIError

    try:
        with _client(url, api_key) as c:
            data = c.export(tenant)
    except APIError as exc:
        raise _fail(exc) from None
    out.write_bytes(data)
    console.print(f"wrote {out} ({len(data)} bytes)")


def _inference_backbone(value: str) -> Literal["shared", "copy"]:
    if value == "shared":
        return "shared"
    if value == "copy":
        return "copy"
    raise typer.BadParameter(
        f"{value!r}: expected 'shared' or 'copy'", param_hint="--inference-backbone"
    )
