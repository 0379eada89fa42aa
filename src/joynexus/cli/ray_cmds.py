"""Runtime choice for ``joynexus run`` (``--runtime embedded|ray``) and
``joynexus scale rollout N`` against a running server.

``scale rollout`` sends ``POST /v1/admin/engines`` to a ``joynexus serve`` (admin key)
and prints the pool after the operation; scaling in drains the leaving engines first,
so the command returns once their requests have finished.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from joynexus.cli.app import app, bench_app

if TYPE_CHECKING:
    from joynexus.runtime.hosting import Placement

console = Console()

scale_app = typer.Typer(help="Elastic scaling of a running server.", no_args_is_help=True)
app.add_typer(scale_app, name="scale")

#: The admin route of the rollout-engine pool (joynexus.server.routes.engines).
ENGINES_PATH = "/v1/admin/engines"


class RuntimeKind(StrEnum):
    embedded = "embedded"
    ray = "ray"


def parse_role_resources(text: str | None) -> dict[str, str] | None:
    """``"actor=trainer,inference=rollout"`` → ``{"actor": "trainer", ...}`` (None: none).

    Raises:
        SpecError: not ``ROLE=RESOURCE`` pairs of the roles actor, inference, environment.
    """
    from joynexus.errors import SpecError
    from joynexus.runtime.placement import ROLES

    if not text:
        return None
    out: dict[str, str] = {}
    for part in text.split(","):
        role, sep, resource = part.strip().partition("=")
        if not sep or role not in ROLES or not resource:
            raise SpecError(
                f"--role-resources {text!r}: expected ROLE=RESOURCE pairs separated by ',' "
                f"with ROLE one of {list(ROLES)}, e.g. 'actor=trainer,inference=rollout'",
                field="role_resources",
            )
        out[role] = resource
    return out


def make_placement(
    kind: RuntimeKind | str,
    *,
    address: str | None = None,
    layout: str = "2-2-4",
    engines: int = 1,
    strategy: str = "PACK",
    role_resources: str | None = None,
    training_ranks: int = 1,
) -> Placement:
    """Where ``joynexus run`` puts the services: in this process (an engine pool), or
    Ray actors (``strategy``, ``role_resources`` and ``training_ranks``: see
    :class:`~joynexus.runtime.ray_hosting.RayPlacement`).

    Raises:
        SpecError: an unknown layout or strategy, bad role resources, or more training
            ranks than actor GPUs.
        InvalidRequestError: more engines than the layout holds.
        ServiceUnavailableError: ``ray`` was asked for but is not installed.
    """
    from joynexus.errors import ServiceUnavailableError, SpecError
    from joynexus.runtime.hosting import EnginePoolPlacement
    from joynexus.runtime.placement import STRATEGIES
    from joynexus.runtime.ray_hosting import RayPlacement

    if RuntimeKind(kind) is RuntimeKind.embedded:
        return EnginePoolPlacement(engines=engines)
    try:
        import ray  # noqa: F401
    except ImportError as exc:  # pragma: no cover - ray is an optional extra
        raise ServiceUnavailableError(
            "--runtime ray needs the 'ray' extra: pip install 'joynexus[ray]'"
        ) from exc
    strategy_name = next((x for x in STRATEGIES if x == strategy.upper()), None)
    if strategy_name is None:
        raise SpecError(
            f"--placement-strategy {strategy!r}: expected one of {list(STRATEGIES)}",
            field="strategy",
        )
    return RayPlacement(
        address=address,
        layout=layout,
        engines=engines,
        strategy=strategy_name,
        role_resources=parse_role_resources(role_resources),  # type: ignore[arg-type]  # roles checked there
        training_ranks=training_ranks,
    )


Url = Annotated[str | None, typer.Option("--url", envvar="JOYNEXUS_URL", help="Server URL.")]
Key = Annotated[
    str | None, typer.Option("--api-key", envvar="JOYNEXUS_API_KEY", help="Admin API key.")
]


@scale_app.command("rollout")
def scale_rollout(
    engines: Annotated[int, typer.Argument(help="Rollout engines to scale the pool to.")],
    url: Url = None,
    api_key: Key = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the pool as JSON.")] = False,
) -> None:
    """Scale a running server's rollout-engine pool to ENGINES (admin key).

    Scaling out syncs every tenant's published weights to the new engines and admits
    them gradually; scaling in drains the leaving engines first. A failed operation is
    rolled back to the previous engines.
    """
    from joynexus.client import APIError, Client
    from joynexus.client._core import Call

    try:
        with Client(url, api_key) as c:
            before = c.call(Call("GET", ENGINES_PATH))
            after = c.call(Call("POST", ENGINES_PATH, json={"engines": engines}))
    except APIError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(after, sort_keys=True))
        return
    console.print(f"rollout pool: {before['engines']} → {after['engines']} engine(s)")
    table = Table("engine", "slot", "state", "weight", "in flight", "answered")
    for e in after["pool"]:
        table.add_row(
            str(e["engine_id"]),
            str(e["slot"]),
            e["state"],
            f"{e['weight']:g}",
            str(e["in_flight"]),
            str(e["answered"]),
        )
    console.print(table)


@bench_app.command("transfer")
def bench_transfer(
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            help="Measure on this running cluster ('auto' or HOST:PORT) between its first "
            "two live nodes; default: start a head and two workers on 127.0.0.1.",
        ),
    ] = None,
    mib: Annotated[int, typer.Option("--mib", min=1, max=4096, help="Object size.")] = 64,
    repeats: Annotated[int, typer.Option("--repeats", min=1, max=20)] = 3,
) -> None:
    """Object-store throughput between Ray nodes (MB/s, best of --repeats): what a
    Training Queue microbatch costs to move from the queue's node to a trainer's."""
    from joynexus.runtime.ray_cluster import LocalCluster, NodeSpec, transfer_mb_per_s
    from joynexus.runtime.ray_hosting import connect

    cluster: LocalCluster | None = None
    if address is None:
        store = max(75, 2 * mib + 16)
        spec = NodeSpec(object_store_mib=store)
        cluster = LocalCluster(spec, [spec, spec])
        nodes = [cluster.head_node_id, *cluster.worker_ids()]
    else:
        import ray

        connect(address)
        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]  # untyped in ray
        if len(nodes) < 2:
            console.print(f"[red]error:[/red] the cluster at {address} has {len(nodes)} live node")
            raise typer.Exit(1)
    try:
        pairs = [(nodes[0], nodes[1])] + ([(nodes[1], nodes[2])] if len(nodes) > 2 else [])
        for src, dst in pairs:
            rate = transfer_mb_per_s(src, dst, mib=mib, repeats=repeats)
            console.print(f"node {src[:8]} → node {dst[:8]}: {mib} MiB at {rate:,.0f} MB/s")
    finally:
        if cluster is not None:
            cluster.shutdown()
