"""The Typer applications every command module registers on.

Command modules (``joynexus.cli.<area>``) import ``app`` / ``bench_app`` from here and
attach their commands; :mod:`joynexus.cli.main` imports them all. Keeping the app
objects in their own module lets each area own one file without import cycles.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="joynexus",
    help="JoyNexus: multi-tenant post-training service for Vision-Language-Action models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

bench_app = typer.Typer(
    help="Benchmarks. Each prints a table and can write JSON (--json PATH).",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")
