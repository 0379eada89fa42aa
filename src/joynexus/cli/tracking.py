"""The ``--tracking`` option of ``joynexus run`` and ``joynexus serve``."""

from __future__ import annotations

from typing import Annotated

import typer

from joynexus.spec.workload import TRACKERS, TrackerName

Tracking = Annotated[
    list[str] | None,
    typer.Option(
        "--tracking",
        help="An experiment tracker for every tenant's learning curves, written offline "
        f"in the run directory (repeatable): {', '.join(TRACKERS)}. A workload spec's "
        "'tracking' chooses its own tenant's (default: tensorboard).",
    ),
]


def trackers_of(values: list[str] | None) -> list[TrackerName]:
    """The trackers ``--tracking`` named, each once.

    Raises:
        typer.BadParameter: a name that is not a tracker.
    """
    out: list[TrackerName] = []
    for value in values or []:
        name = next((t for t in TRACKERS if t == value.strip().lower()), None)
        if name is None:
            raise typer.BadParameter(
                f"{value!r} is not a tracker; choose from {', '.join(TRACKERS)}",
                param_hint="--tracking",
            )
        if name not in out:
            out.append(name)
    return out
