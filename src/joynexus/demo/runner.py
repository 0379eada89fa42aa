"""``joynexus demo``: the §5.1 mixture on an in-process Master, then the isolated baseline.

Layout of the output directory::

    DIR/data/<dataset>/        SFT demonstrations (recorded on first use, then reused)
    DIR/models/                the tiny backbone, built once and shared by every phase
    DIR/multi/                 the multi-tenant run (scheduler.sqlite, usage.json, metrics/)
    DIR/multi/outputs/<tenant>/  its checkpoints; workloads/<id>/metrics.jsonl its records
    DIR/isolated/<tenant>/     one isolated replay per tenant (same files)
    DIR/report.json, DIR/*.png the report

Every phase runs fresh in its own run directory (a stale checkpoint would otherwise
resume a tenant, and old jobs would be counted); the data and the model cache are kept.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from joynexus.demo.baseline import replay_isolated
from joynexus.demo.mixture import DemoMixture, Profile, build_mixture
from joynexus.demo.phase import PhaseTrace, run_phase
from joynexus.demo.report import build_report, plot_report, report_tables, write_report
from joynexus.spec.workload import WorkloadSpec
from joynexus.workflows.summary import TenantProgress

__all__ = ["DemoResult", "run_demo"]


@dataclass
class DemoResult:
    """What :func:`run_demo` produced."""

    report: dict[str, Any]
    report_path: Path
    plots: list[Path]
    multi: PhaseTrace
    isolated: list[PhaseTrace]
    mixture: DemoMixture
    total_s: float


class _Bars:
    """Progress bars: one per tenant and phase, one per recording."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.bars: dict[str, TaskID] = {}
        self.phase = ""

    def on_progress(self, rows: list[TenantProgress]) -> None:
        for row in rows:
            key = f"{self.phase}/{row.tenant}"
            info = f"v{row.version}" if row.version is not None else "eval runs"
            if row.done:
                info += " [green]done[/green]"
            if key not in self.bars:
                self.bars[key] = self.progress.add_task(
                    "", total=row.target, label=f"{self.phase} {row.tenant}", info=info
                )
            self.progress.update(self.bars[key], completed=row.completed, info=info)

    def on_record(self, tenant: str, episode: int, length: int, success: bool) -> None:
        key = f"record/{tenant}"
        if key not in self.bars:
            self.bars[key] = self.progress.add_task(
                "", total=None, label=f"recording demos for {tenant}", info=""
            )
        self.progress.update(
            self.bars[key], completed=episode + 1, info=f"episode {episode + 1}: {length} frames"
        )

    def status(self, msg: str) -> None:
        self.progress.console.print(f"[dim]{self.phase}: {msg}[/dim]")


def _link_models(models: Path) -> Any:
    def prepare(run_dir: Path) -> None:
        link = run_dir / "models"
        if not link.exists():
            link.symlink_to(models.resolve(), target_is_directory=True)

    return prepare


def _record_totals(mixture: DemoMixture, bars: _Bars) -> None:
    for spec in mixture.specs:
        if spec.dataset is not None:
            for key, task_id in bars.bars.items():
                if key == f"record/{spec.tenant}":
                    bars.progress.update(task_id, total=spec.dataset.record_episodes)


async def run_demo(
    out_dir: Path,
    *,
    minutes: float = 10.0,
    profile: Profile | None = None,
    rl_updates: int | None = None,
    sft_jobs: int | None = None,
    torch_threads: int | None = None,
    console: Console | None = None,
) -> DemoResult:
    """Run the multi-tenant mixture, replay it isolated, write the report and plots.

    Args:
        out_dir: Output directory (see the module docstring for its layout).
        minutes: Budget of the whole demo; the workloads' completion targets scale with it.
        profile: Force the environment profile (default: chosen from ``minutes``).
        rl_updates / sft_jobs: Override the completion targets.
        torch_threads: torch intra-op threads of this process (None: leave as is).
        console: Where progress and tables go (default: a new rich console).

    Raises:
        JoyNexusError: a bad spec or an environment that cannot start.
        RuntimeError: a phase completed fewer updates than its matched work.
    """
    console = console or Console()
    t0 = time.monotonic()
    if torch_threads is not None:
        import torch

        # The backbone shares 2 cores with the simulator worker processes; extra
        # intra-op threads only contend with them (measured many times slower).
        torch.set_num_threads(torch_threads)
    out_dir = out_dir.resolve()
    mixture = build_mixture(
        out_dir / "multi" / "outputs",
        minutes=minutes,
        profile=profile,
        data_dir=out_dir / "data",
        rl_updates=rl_updates,
        sft_jobs=sft_jobs,
    )
    console.print(f"[bold]environments:[/bold] {mixture.profile} — {mixture.reason}")
    for sub in ("multi", "isolated"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    models = out_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    prepare = _link_models(models)
    (out_dir / "multi").mkdir(parents=True)
    prepare(out_dir / "multi")
    _describe(mixture, console)

    with Progress(
        TextColumn("[bold]{task.fields[label]}[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
    ) as progress:
        bars = _Bars(progress)
        bars.phase = "multi-tenant"

        def on_record(tenant: str, episode: int, length: int, success: bool) -> None:
            bars.on_record(tenant, episode, length, success)
            _record_totals(mixture, bars)

        multi = await run_phase(
            "multi-tenant",
            mixture.specs,
            out_dir / "multi",
            matched=None,
            fill_tenants=[mixture.sft_tenant],
            on_progress=bars.on_progress,
            on_status=bars.status,
            on_record_episode=on_record,
        )
        # Matched work: every RL update the multi-tenant run completed (its window ends
        # at the last one) and the SFT updates completed inside that window.

        def on_phase(name: str, spec: WorkloadSpec) -> None:
            bars.phase = name

        isolated = await replay_isolated(
            mixture.training_specs,
            multi.matched,
            out_dir / "isolated",
            prepare_run_dir=prepare,
            on_phase=on_phase,
            on_progress=bars.on_progress,
            on_status=bars.status,
        )
    report = build_report(
        multi,
        isolated,
        profile=mixture.profile,
        reason=mixture.reason,
        knobs=mixture.knobs(),
        rl_tenants=mixture.rl_tenants,
        sft_tenant=mixture.sft_tenant,
        eval_tenant=mixture.eval_tenant,
    )
    plots = plot_report(report, multi, isolated, out_dir)
    report["plots"] = [p.name for p in plots]
    total = time.monotonic() - t0
    report["demo_total_s"] = round(total, 1)
    path = write_report(report, out_dir)
    for table in report_tables(report):
        console.print(table)
    console.print(
        f"wrote {path} and {', '.join(p.name for p in plots)} (demo took {total / 60:.1f} min)"
    )
    return DemoResult(report, path, plots, multi, isolated, mixture, total)


def _describe(mixture: DemoMixture, console: Console) -> None:
    for spec in mixture.specs:
        env = spec.env
        what = f"{env.kind} {env.task or ''}".rstrip() if env is not None else ""
        if spec.task.value == "rl":
            extra = f", {spec.scheduling.completion_target} updates"
        elif spec.task.value == "sft":
            extra = ", fills idle actor time until the RL tenants finish"
        else:
            extra = ""
        console.print(f"  {spec.tenant}: {spec.task.value} on {what}{extra}")
    knobs = ", ".join(f"{k}={v}" for k, v in mixture.knobs().items())
    console.print(f"  knobs: {knobs}")
