"""``--device-cores`` of ``joynexus run`` and ``joynexus demo`` (see
:mod:`joynexus.utils.affinity`): parsed into a core plan, or a clear error (exit 2)."""

from __future__ import annotations

import typer
from rich.console import Console

from joynexus.errors import JoyNexusError
from joynexus.utils.affinity import CorePlan, plan_cores

__all__ = ["DEVICE_CORES_HELP", "core_plan_or_exit"]

DEVICE_CORES_HELP = (
    "Run the device work (training steps, inference batches; torch threads matched) on "
    "these cores and the simulator worker processes on the others, so the device idles "
    "while simulators step as a GPU would; the service's Python keeps every core: a core list "
    "(0, 0-1, 0,2-3), auto (first half of the cores for the device, the rest for the "
    "simulators) or none."
)


def core_plan_or_exit(option: str, console: Console) -> CorePlan:
    """The plan for ``--device-cores option``, printed; a bad value exits with code 2."""
    try:
        plan = plan_cores(option)
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    console.print(plan.describe(), highlight=False)
    return plan
