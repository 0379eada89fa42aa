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

Before anything starts the simulators are chosen and checked (:func:`choose_envs`).
On a terminal progress is drawn as live bars; otherwise (output to a file or a pipe) as
plain lines: each phase's start, every status message, each tenant's end, and one line
with every tenant's progress every :data:`PLAIN_PROGRESS_EVERY_S` seconds.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from joynexus.demo.baseline import replay_isolated
from joynexus.demo.mixture import (
    DemoMixture,
    EnvCheck,
    Profile,
    build_mixture,
    choose_envs,
)
from joynexus.demo.phase import PhaseTrace, run_phase
from joynexus.demo.plots import plot_report
from joynexus.demo.readout import print_report
from joynexus.demo.report import build_report, write_report
from joynexus.runtime.hosting import RuntimeConfig
from joynexus.services.environment import EnvironmentServiceConfig
from joynexus.spec.workload import WorkloadSpec
from joynexus.utils.affinity import CorePlan, current_affinity, on_device, pin_device
from joynexus.workflows.summary import TenantProgress

__all__ = ["PLAIN_PROGRESS_EVERY_S", "DemoResult", "PlainProgress", "run_demo"]

#: Off a terminal, the longest silence between two progress lines of a phase.
PLAIN_PROGRESS_EVERY_S = 30.0


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


def _what(row: TenantProgress) -> str:
    """What a row counts: evaluation runs, or updates and the policy version reached."""
    if row.task == "eval":
        return "eval runs"
    return f"v{row.version}" if row.version is not None else ""


class _Reporter(Protocol):
    phase: str

    def start_phase(self, name: str) -> None: ...

    def on_progress(self, rows: list[TenantProgress]) -> None: ...

    def on_record(self, tenant: str, episode: int, length: int, success: bool) -> None: ...

    def set_record_total(self, tenant: str, total: int) -> None: ...

    def status(self, msg: str) -> None: ...


class _Bars:
    """Progress bars (on a terminal): one per tenant and phase, one per recording."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.bars: dict[str, TaskID] = {}
        self.phase = ""

    def start_phase(self, name: str) -> None:
        self.phase = name

    def set_record_total(self, tenant: str, total: int) -> None:
        task_id = self.bars.get(f"record/{tenant}")
        if task_id is not None:
            self.progress.update(task_id, total=total)

    def on_progress(self, rows: list[TenantProgress]) -> None:
        for row in rows:
            key = f"{self.phase}/{row.tenant}"
            info = _what(row)
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
        self.progress.console.print(f"[dim]{self.phase}: {escape(msg)}[/dim]", emoji=False)


class PlainProgress:
    """Progress as plain lines, for output that is not a terminal (a file, a pipe).

    Live bars print nothing there until they stop; these lines say at once that a
    phase started, every status message and when a tenant is done, and give every
    tenant's progress in one line every ``every_s`` seconds.
    """

    def __init__(
        self,
        console: Console,
        *,
        every_s: float = PLAIN_PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.every_s = every_s
        self.clock = clock
        self.phase = ""
        self._t0 = clock()
        self._last = -float("inf")
        self._done: set[str] = set()
        self._record_totals: dict[str, int] = {}

    def _line(self, text: str) -> None:
        elapsed = int(self.clock() - self._t0)
        self.console.print(
            f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {text}",
            markup=False,
            highlight=False,
            emoji=False,
            soft_wrap=True,
        )

    def start_phase(self, name: str) -> None:
        self.phase = name
        self._last = -float("inf")
        self._done.clear()
        self._line(f"phase {name}: started")

    def set_record_total(self, tenant: str, total: int) -> None:
        self._record_totals[tenant] = total

    @staticmethod
    def _row(row: TenantProgress) -> str:
        count = f"{row.completed}/{row.target}" if row.target is not None else str(row.completed)
        what = _what(row)
        return f"{row.tenant} {count}{' ' + what if what else ''}{' done' if row.done else ''}"

    def on_progress(self, rows: list[TenantProgress]) -> None:
        now = self.clock()
        finished = [r for r in rows if r.done and r.tenant not in self._done]
        for row in finished:
            self._done.add(row.tenant)
            self._line(f"{self.phase}: {self._row(row)}")
        if now - self._last >= self.every_s:
            self._last = now
            self._line(f"{self.phase}: " + ", ".join(self._row(r) for r in rows))

    def on_record(self, tenant: str, episode: int, length: int, success: bool) -> None:
        total = self._record_totals.get(tenant)
        of = f"/{total}" if total else ""
        outcome = "success" if success else "no success"
        self._line(
            f"recording demos for {tenant}: episode {episode + 1}{of}, {length} frames, {outcome}"
        )

    def status(self, msg: str) -> None:
        self._line(f"{self.phase}: {msg}")


@contextlib.contextmanager
def _reporter(console: Console) -> Iterator[_Reporter]:
    if not console.is_terminal:
        yield PlainProgress(console)
        return
    with Progress(
        TextColumn("[bold]{task.fields[label]}[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
    ) as progress:
        yield _Bars(progress)


def _link_models(models: Path) -> Any:
    def prepare(run_dir: Path) -> None:
        link = run_dir / "models"
        if not link.exists():
            link.symlink_to(models.resolve(), target_is_directory=True)

    return prepare


def _record_totals(mixture: DemoMixture, bars: _Reporter) -> None:
    for spec in mixture.specs:
        if spec.dataset is not None:
            bars.set_record_total(spec.tenant, spec.dataset.record_episodes)


async def run_demo(
    out_dir: Path,
    *,
    minutes: float = 10.0,
    profile: Profile | None = None,
    rl_updates: int | None = None,
    sft_jobs: int | None = None,
    torch_threads: int | None = None,
    console: Console | None = None,
    env_check: EnvCheck | None = None,
    core_plan: CorePlan | None = None,
    success_episodes: int | None = None,
) -> DemoResult:
    """Run the multi-tenant mixture, replay it isolated, write the report and plots.

    Args:
        out_dir: Output directory (see the module docstring for its layout).
        minutes: Budget of the whole demo; the workloads' completion targets scale with it.
        profile: Force the environment profile (default: chosen from ``minutes``).
        rl_updates / sft_jobs: Override the completion targets.
        torch_threads: torch intra-op threads of this process (None: leave as is).
        console: Where progress and tables go (default: a new rich console).
        env_check: How simulators are checked before the start (default: files, then
            renderers; see :func:`~joynexus.demo.mixture.choose_envs`).
        core_plan: Pin this process (the model services, torch threads matched) and the
            simulator workers to its cores for every phase, restored at the end
            (default: no pinning; ``joynexus demo`` passes ``--device-cores auto``).
            ``torch_threads``, when given, overrides the matched thread count. What was
            applied is in the report's ``core_pinning``.
        success_episodes: Episodes of each trainable tenant's success measurement,
            before and after its training in its isolated replay (default: the
            profile's :data:`~joynexus.demo.mixture.SUCCESS_EPISODES` for the RL
            tenants and :data:`~joynexus.demo.mixture.SFT_SUCCESS_EPISODES` for the SFT
            tenant; 0: not measured); the report's ``success_episodes`` and
            ``sft_success_episodes``, the rates in ``success_rates``.

    Raises:
        JoyNexusError: a bad spec, or simulators that cannot run here (raised before
            anything starts, saying what to install or set).
        RuntimeError: a phase completed fewer updates than its matched work.
    """
    console = console or Console()
    plan = core_plan or CorePlan(mode="none", note="not requested")
    with pin_device(plan):
        pinning = plan.to_json()
        # Read back from the kernel: what is really applied, not what was asked.
        pinning["host_affinity"] = current_affinity() if plan.pinned else None
        with on_device():  # what a training step or inference batch runs on
            pinning["device_affinity"] = current_affinity() if plan.pinned else None
        config = (
            RuntimeConfig(env=EnvironmentServiceConfig(worker_cores=plan.worker_cores))
            if plan.pinned
            else None
        )
        return await _run_demo(
            out_dir,
            minutes=minutes,
            profile=profile,
            rl_updates=rl_updates,
            sft_jobs=sft_jobs,
            torch_threads=torch_threads,
            console=console,
            env_check=env_check,
            config=config,
            pinning=pinning,
            success_episodes=success_episodes,
        )


async def _run_demo(
    out_dir: Path,
    *,
    minutes: float,
    profile: Profile | None,
    rl_updates: int | None,
    sft_jobs: int | None,
    torch_threads: int | None,
    console: Console,
    env_check: EnvCheck | None,
    config: RuntimeConfig | None,
    pinning: dict[str, Any],
    success_episodes: int | None,
) -> DemoResult:
    t0 = time.monotonic()
    if torch_threads is not None:
        import torch

        # The backbone shares 2 cores with the simulator worker processes; extra
        # intra-op threads only contend with them (measured many times slower).
        torch.set_num_threads(torch_threads)
    out_dir = out_dir.resolve()
    choice = await choose_envs(minutes, profile, check=env_check)
    mixture = build_mixture(
        out_dir / "multi" / "outputs",
        minutes=minutes,
        profile=choice.profile,
        data_dir=out_dir / "data",
        rl_updates=rl_updates,
        sft_jobs=sft_jobs,
        reason=choice.reason,
        success_episodes=success_episodes,
    )
    console.print(
        f"[bold]environments:[/bold] {mixture.profile} — {escape(mixture.reason)}",
        highlight=False,
        soft_wrap=True,
        emoji=False,
    )
    for sub in ("multi", "isolated"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    models = out_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    prepare = _link_models(models)
    (out_dir / "multi").mkdir(parents=True)
    prepare(out_dir / "multi")
    _describe(mixture, console)

    with _reporter(console) as bars:
        bars.start_phase("multi-tenant")

        _record_totals(mixture, bars)

        def on_record(tenant: str, episode: int, length: int, success: bool) -> None:
            bars.on_record(tenant, episode, length, success)
            _record_totals(mixture, bars)  # a bar exists once its first episode is in

        multi = await run_phase(
            "multi-tenant",
            mixture.multi_tenant_specs,
            out_dir / "multi",
            matched=None,
            fill_tenants=[mixture.sft_tenant],
            on_progress=bars.on_progress,
            on_status=bars.status,
            on_record_episode=on_record,
            config=config,
        )
        # Matched work: every RL update the multi-tenant run completed (its window ends
        # at the last one) and the SFT updates completed inside that window.

        def on_phase(name: str, spec: WorkloadSpec) -> None:
            bars.start_phase(name)

        isolated = await replay_isolated(
            mixture.training_specs,
            multi.matched,
            out_dir / "isolated",
            prepare_run_dir=prepare,
            on_phase=on_phase,
            on_progress=bars.on_progress,
            on_status=bars.status,
            config=config,
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
    report["env_unavailable"] = dict(choice.unavailable)
    report["core_pinning"] = pinning
    report["success_episodes"] = mixture.success_episodes
    report["sft_success_episodes"] = mixture.sft_success_episodes
    plots = plot_report(report, multi, isolated, out_dir)
    report["plots"] = [p.name for p in plots]
    total = time.monotonic() - t0
    report["demo_total_s"] = round(total, 1)
    path = write_report(report, out_dir)
    print_report(report, console)
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
    if mixture.success_episodes or mixture.sft_success_episodes:
        console.print(
            f"  success rate: each RL tenant measured on {mixture.success_episodes} "
            f"episodes and the SFT tenant on {mixture.sft_success_episodes}, before its "
            "first update and after its last, in its isolated replay"
        )
