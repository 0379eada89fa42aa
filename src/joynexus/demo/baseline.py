"""The isolated single-tenant baseline of §5.1, replayed on the same matched work.

Each RL tenant runs alone, with its completion target set to the number of updates it
completed in the multi-tenant run; then the SFT tenant runs alone with its matched
number of jobs — one after another, through the same code (an in-process Master,
:class:`~joynexus.master.run.LocalRun`, hosting one tenant). Every replay runs fresh in
its own run directory (``<root>/<tenant>``, outputs in ``<root>/<tenant>/outputs``), so
nothing resumes from the multi-tenant run's checkpoints or counts its jobs.

A replayed spec keeps its ``success_eval`` (the demo declares one per trainable tenant):
the Master measures the tenant's success rate before its loops start and after its last
update, both outside the replay's window, so the measurement adds to the replay's wall
time but not to the work compared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from joynexus.demo.phase import PhaseTrace, run_phase
from joynexus.runtime.hosting import RuntimeConfig
from joynexus.spec.workload import WorkloadSpec
from joynexus.workflows.summary import TenantProgress

__all__ = ["isolated_specs", "replay_isolated"]


def isolated_specs(
    training_specs: Sequence[WorkloadSpec], matched: Mapping[str, int], out_dir: Path
) -> list[WorkloadSpec]:
    """One spec per tenant, completion target = its matched updates, outputs under
    ``out_dir``; tenants with no matched update are left out (there is nothing to
    replay)."""
    out: list[WorkloadSpec] = []
    for spec in training_specs:
        n = matched.get(spec.tenant, 0)
        if n <= 0:
            continue
        sched = spec.scheduling.model_copy(update={"completion_target": n})
        out.append(spec.model_copy(update={"scheduling": sched, "output_dir": out_dir}))
    return out


async def replay_isolated(
    training_specs: Sequence[WorkloadSpec],
    matched: Mapping[str, int],
    root: Path,
    *,
    prepare_run_dir: Callable[[Path], None] | None = None,
    on_phase: Callable[[str, WorkloadSpec], None] | None = None,
    on_progress: Callable[[list[TenantProgress]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    config: RuntimeConfig | None = None,
) -> list[PhaseTrace]:
    """Replay every tenant alone, RL tenants first, then SFT (as in §5.1).

    Args:
        training_specs: The multi-tenant run's RL and SFT specs.
        matched: Updates per tenant observed in the multi-tenant run.
        root: Parent of the replays' run directories (``<root>/<tenant>``, each with
            its own ``outputs/``).
        prepare_run_dir: Called on each replay's run directory before it starts (the
            demo links the shared tiny-model cache there).
        on_phase: Called as ``(phase name, spec)`` when a replay starts.
        config: Plane knobs of every replay (as in the multi-tenant run).

    Returns:
        One trace per replay, each with ``matched = {tenant: n}``.
    """
    specs = isolated_specs(training_specs, matched, root)
    specs.sort(key=lambda s: 0 if s.task.value == "rl" else 1)
    traces: list[PhaseTrace] = []
    for spec in specs:
        name = f"isolated:{spec.tenant}"
        run_dir = root / spec.tenant
        # The Master writes a run's outputs under its run directory; say so in the spec.
        spec = spec.model_copy(update={"output_dir": run_dir / "outputs"})
        run_dir.mkdir(parents=True, exist_ok=True)
        if prepare_run_dir is not None:
            prepare_run_dir(run_dir)
        if on_phase is not None:
            on_phase(name, spec)
        traces.append(
            await run_phase(
                name,
                [spec],
                run_dir,
                matched={spec.tenant: matched[spec.tenant]},
                on_progress=on_progress,
                on_status=on_status,
                config=config,
            )
        )
    return traces
