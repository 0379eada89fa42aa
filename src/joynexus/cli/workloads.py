"""Client commands on a running server's workloads and policies.

``status`` (a live table on a terminal, one table with ``--once``; tab-separated lines,
ids never cut, when the output is piped; with each evaluation's latest success rates),
``pause`` / ``resume`` / ``cancel``, and ``load-weights`` (publish an exported action
module, e.g. a file of ``joynexus export``, as a tenant's serving version). URL and key
as for every client command: ``--url`` / ``--api-key`` or ``JOYNEXUS_URL`` /
``JOYNEXUS_API_KEY``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

from joynexus.cli.app import app
from joynexus.cli.serve import Key, Url, _client, _fail, console

if TYPE_CHECKING:
    from joynexus.client import Client, WorkloadStatus


def _eval_cell(client: Client, status: WorkloadStatus) -> str:
    """An evaluation's latest run per target: ``target rate [lo, hi] @vN seeds a..b``."""
    if status.task != "eval":
        return ""
    records = client.metrics(status.workload_id, kind="eval").records
    if not records:
        return ""
    last = max(int(r["run"]) for r in records)
    cells = []
    for r in records:
        if int(r["run"]) != last:
            continue
        ci = r.get("success_ci95")
        interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        seeds = _seeds_text(r.get("seeds"))
        rate = f"{float(r['success_rate']):.2f}{interval}"
        cells.append(f"{r['target']} {rate} @v{r['version']}{seeds}")
    return "; ".join(cells)


def _seeds_text(seeds: list[int] | None) -> str:
    """`` seeds a..b`` for a range, `` seeds a,b,c`` otherwise; empty when unseeded."""
    if not seeds:
        return ""
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))) and len(seeds) > 1:
        return f" seeds {seeds[0]}..{seeds[-1]}"
    return " seeds " + ",".join(str(x) for x in seeds)


COLUMNS = ("workload", "task", "state", "jobs", "version", "evaluation", "error")


def _cells(client: Client, rows: list[WorkloadStatus]) -> list[list[str]]:
    out = []
    for r in rows:
        if r.task == "eval":
            jobs = f"{r.eval_runs_completed}/{r.eval_runs_target} runs"
        else:
            jobs = f"{r.jobs_completed}/{r.jobs_target if r.jobs_target is not None else '∞'}"
        version = "" if r.policy_version is None else str(r.policy_version)
        evaluation = _eval_cell(client, r)
        out.append([r.workload_id, r.task, r.state.value, jobs, version, evaluation, r.error or ""])
    return out


def _table(client: Client, rows: list[WorkloadStatus]) -> Table:
    cells = _cells(client, rows)
    table = Table(*COLUMNS)
    # An id is pasted into other commands: never cut or wrapped, the other columns give.
    table.columns[0].no_wrap = True
    table.columns[0].min_width = max((len(c[0]) for c in cells), default=0)
    for row in cells:
        table.add_row(*row)
    return table


def _plain(client: Client, rows: list[WorkloadStatus]) -> str:
    """Tab-separated lines, a header first: whole ids whatever the width, for ``cut``."""
    lines = ["\t".join(COLUMNS)] + ["\t".join(r) for r in _cells(client, rows)]
    return "\n".join(line.replace("\n", " ") for line in lines)


@app.command("status")
def status(
    workload: Annotated[str | None, typer.Argument(help="One workload (default: all).")] = None,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch/--once",
            help="Refresh live (on a terminal; piped output always gets one table).",
        ),
    ] = True,
    interval: Annotated[float, typer.Option(help="Refresh period in seconds.")] = 1.0,
    url: Url = None,
    api_key: Key = None,
) -> None:
    """A table of workloads: state, jobs completed / target, policy version, evaluation."""
    from joynexus.client import APIError

    try:
        with _client(url, api_key) as c:

            def rows() -> list[WorkloadStatus]:
                return [c.status(workload)] if workload else c.list_workloads()

            current = rows()
            # A live display redraws in place, which only a terminal shows: into a pipe
            # or a file it would print nothing until every workload ended.
            if not console.is_terminal:  # a pipe or a file: plain lines, ids whole
                typer.echo(_plain(c, current))
                return
            if not watch:
                console.print(_table(c, current))
                return
            with Live(_table(c, current), console=console, refresh_per_second=4) as live:
                while not all(r.state.is_terminal for r in current):
                    time.sleep(interval)
                    current = rows()
                    live.update(_table(c, current))
    except APIError as exc:
        raise _fail(exc) from None


def _lifecycle(workload: str, action: str, url: str | None, api_key: str | None) -> None:
    from joynexus.client import APIError

    try:
        with _client(url, api_key) as c:
            act = {"pause": c.pause, "resume": c.resume, "cancel": c.cancel}[action]
            st = act(workload)
    except APIError as exc:
        raise _fail(exc) from None
    console.print(f"{st.workload_id}: {st.state.value}")


@app.command("pause")
def pause(workload: str, url: Url = None, api_key: Key = None) -> None:
    """Pause a workload: no new jobs start; its slot, sessions and checkpoints stay."""
    _lifecycle(workload, "pause", url, api_key)


@app.command("resume")
def resume(workload: str, url: Url = None, api_key: Key = None) -> None:
    """Resume a paused workload (or one a global restart failed) from its checkpoints."""
    _lifecycle(workload, "resume", url, api_key)


@app.command("cancel")
def cancel(workload: str, url: Url = None, api_key: Key = None) -> None:
    """Cancel a workload (releases its sessions, partitions and slot)."""
    _lifecycle(workload, "cancel", url, api_key)


def _weights_of(path: Path) -> tuple[dict[str, Any], int | None]:
    """The named tensors of an exported action module and the version it names."""
    from joynexus.wire import unpackb

    try:
        data = unpackb(path.read_bytes())
    except OSError as exc:
        raise typer.BadParameter(f"{path}: {exc.strerror or exc}", param_hint="FILE") from None
    except Exception as exc:  # not msgpack: say what the file must be
        raise typer.BadParameter(
            f"{path} is not an exported action module (msgpack from `joynexus export`): {exc}",
            param_hint="FILE",
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("named_tensors"), dict):
        raise typer.BadParameter(
            f"{path} holds no 'named_tensors' (write one with `joynexus export`)",
            param_hint="FILE",
        )
    manifest = data.get("manifest") if isinstance(data.get("manifest"), dict) else {}
    version = data.get("policy_version", (manifest or {}).get("policy_version"))
    return dict(data["named_tensors"]), None if version is None else int(version)


def load_weights(
    tenant: Annotated[str, typer.Argument(help="The tenant whose serving weights change.")],
    file: Annotated[
        Path, typer.Argument(help="An exported action module (`joynexus export` writes one).")
    ],
    version: Annotated[
        int | None,
        typer.Option(help="Serving version to publish (default: the version the file names)."),
    ] = None,
    url: Url = None,
    api_key: Key = None,
) -> None:
    """Publish an exported action module as the tenant's serving weights (inference)."""
    from joynexus.client import APIError

    named, named_version = _weights_of(file)
    chosen = version if version is not None else named_version
    if chosen is None:
        raise typer.BadParameter(f"{file} names no policy version; pass --version")
    try:
        with _client(url, api_key) as c:
            served = c.load_weights(tenant, chosen, named)
    except APIError as exc:
        raise _fail(exc) from None
    console.print(f"{tenant}: serving version {served} ({len(named)} tensors from {file})")


app.command("load-weights")(load_weights)
# The paper's and the client's name for it, so both spellings work.
app.command("load_weights", hidden=True)(load_weights)
