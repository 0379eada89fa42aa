"""One phase of the demo: run specs to their end on an in-process Master, keep its trace.

A phase is one :class:`~joynexus.master.run.LocalRun` (the multi-tenant run, or one
isolated replay) in its own run directory, started fresh (``fresh=True``: a rerun never
mixes with an earlier run's jobs, checkpoints or usage). Before any workload is
submitted, a callback sink on the plane's Metrics Service starts keeping every service's
busy interval — one per grouped inference batch (``inference.batch_latency_s``), per
optimizer / actor-forward step (``training.step_latency_s``) and per simulator call
(``env.step_latency_s``), each ending at its event's timestamp — the same measurements
the plane's :class:`UsageMeter` accumulates into ``usage.json``. Beside them a
:class:`~joynexus.utils.device_clock.SpanRecorder` keeps, for every stretch of device
work, the device thread's own CPU seconds and its run-queue wait (ready, but its core ran
something else: another process, or this one's host threads), and a
:class:`~joynexus.demo.machine.LoadProbe` the machine's load. After the run the
scheduler's job records give each update's actor phase (``leased_at`` →
``finished_at``), which fixes the measurement window: from the moment the first
workload's loops start (its ``running`` lifecycle record; the Master launches the
workloads concurrently) to the completion of the last matched update.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from joynexus.api import UsageReport
from joynexus.control.job import JobState, TaskType
from joynexus.demo.machine import LoadProbe, MachineLoad
from joynexus.errors import EnvironmentServiceError, InternalError, JoyNexusError
from joynexus.master.run import LocalRun, record_missing_datasets, wipe_run_state
from joynexus.metrics.events import MetricEvent
from joynexus.runtime.hosting import RuntimeConfig
from joynexus.spec.workload import WorkloadSpec
from joynexus.utils.affinity import pinned_device_cores
from joynexus.utils.device_clock import DeviceSpan, SpanRecorder
from joynexus.workflows.compile import compile_workloads
from joynexus.workflows.summary import RunSummary, TenantProgress

__all__ = [
    "BUSY_EVENTS",
    "SIM_WAIT_EVENT",
    "Interval",
    "JobRecord",
    "PhaseTrace",
    "run_phase",
    "shortfall",
    "span_fraction",
    "window_busy_seconds",
    "window_union_seconds",
]

#: The services that run on the shared device (the simulators run beside it).
DEVICE_SERVICES = ("training", "inference")

#: A simulator call's run-queue wait, emitted just before its ``env.step_latency_s``.
SIM_WAIT_EVENT = "env.step_wait_s"
#: The rows of one (grouped) training step: a step of several jobs' microbatches runs
#: one shared forward over all their rows.
STEP_ROWS_EVENT = "training.step_rows"

#: Metric event name -> service whose busy time it measures.
BUSY_EVENTS: dict[str, str] = {
    "training.step_latency_s": "training",
    "inference.batch_latency_s": "inference",
    "env.step_latency_s": "environment",
}


@dataclass(frozen=True)
class Interval:
    """A busy interval of one service, in wall-clock seconds."""

    service: str
    start: float
    end: float
    #: The tenant a simulator call served (None for the shared services).
    tenant: str | None = None
    #: A simulator call's run-queue wait: seconds its worker was ready to run while its
    #: core ran something else (None: not measured, or not a simulator call).
    wait_s: float | None = None


@dataclass(frozen=True)
class JobRecord:
    """A training job of the phase, as the scheduler recorded it."""

    tenant_id: str
    task: str
    state: str
    leased_at: float | None
    finished_at: float | None


@dataclass
class PhaseTrace:
    """What one phase measured.

    Attributes:
        name: ``multi-tenant`` or ``isolated:<tenant>``.
        run_dir: The phase's run directory (``usage.json``, ``scheduler.sqlite``,
            ``outputs/``, ``metrics/``).
        started_at: Wall-clock time when the first workload's loops started.
        ended_at: Completion of the last matched update (see :func:`run_phase`).
        wall_s: The whole run (model load, sessions, checkpoints included).
        busy: Busy intervals of every service.
        jobs: Every training job with its actor-phase timestamps.
        usage: The usage meter's final report.
        records: Per-tenant workflow records (``train``, ``rollout``, ``eval`` ...).
        summary: The run summary.
        predict_stages: Seconds and events per predict stage
            (:mod:`joynexus.metrics.stages`), e.g. how long inference batches waited
            for the backbone lock while training held it.
        device_spans: Every stretch of device work with the device thread's own CPU
            seconds and run-queue wait (:mod:`joynexus.utils.device_clock`).
        machine: The machine's load over the phase.
        device_cores: The device's cores (None: not pinned).
        step_rows: ``(time, rows)`` of every training step (:data:`STEP_ROWS_EVENT`).
    """

    name: str
    run_dir: Path
    started_at: float
    ended_at: float
    wall_s: float
    busy: list[Interval]
    jobs: list[JobRecord]
    usage: UsageReport
    records: dict[str, list[dict[str, Any]]]
    summary: RunSummary
    matched: dict[str, int] = field(default_factory=dict)
    predict_stages: dict[str, tuple[float, int]] = field(default_factory=dict)
    device_spans: list[DeviceSpan] = field(default_factory=list)
    machine: MachineLoad = field(default_factory=MachineLoad)
    device_cores: list[int] | None = None
    step_rows: list[tuple[float, float]] = field(default_factory=list)

    @property
    def window_s(self) -> float:
        return max(self.ended_at - self.started_at, 1e-9)

    def completed(self, tenant_id: str) -> list[JobRecord]:
        """The tenant's completed jobs in completion order."""
        done = [
            j for j in self.jobs if j.tenant_id == tenant_id and j.state == JobState.COMPLETED.value
        ]
        return sorted(done, key=lambda j: j.finished_at or 0.0)

    def updates_in_window(self, tenant_id: str) -> int:
        """Completed updates of the tenant whose completion falls inside the window."""
        return sum(
            1
            for j in self.completed(tenant_id)
            if j.finished_at is not None and j.finished_at <= self.ended_at + 1e-6
        )

    def busy_seconds(self, service: str) -> float:
        """Busy seconds of ``service`` inside the window."""
        return window_busy_seconds(self.busy, service, self.started_at, self.ended_at)

    def utilization(self, service: str) -> float:
        return self.busy_seconds(service) / self.window_s

    def device_busy_seconds(self) -> float:
        """Seconds inside the window in which the shared device (the backbone's training
        or inference) was busy, each moment counted once."""
        return window_union_seconds(self.busy, DEVICE_SERVICES, self.started_at, self.ended_at)

    def device_cpu_seconds(self) -> float:
        """The device thread's own CPU seconds inside the window (each span's share that
        falls inside it)."""
        return sum(
            sp.cpu_s * span_fraction(sp, self.started_at, self.ended_at) for sp in self.device_spans
        )

    def device_own_busy_seconds(self) -> float:
        """The device's busy seconds on its own clock: its thread's CPU seconds, or the
        wall busy seconds where no device span was recorded (nothing to correct)."""
        return self.device_cpu_seconds() if self.device_spans else self.device_busy_seconds()

    def device_wait_seconds(self) -> float | None:
        """The device thread's run-queue wait inside the window: ready to run, but its
        core ran another thread or process (None where the platform does not say)."""
        if any(sp.wait_s is None for sp in self.device_spans):
            return None
        return sum(
            (sp.wait_s or 0.0) * span_fraction(sp, self.started_at, self.ended_at)
            for sp in self.device_spans
        )

    def device_interference_seconds(self) -> float:
        """Seconds of the window the device's work lost to other threads and processes
        on its core: the run-queue wait, or where that is not measured, the wall busy
        seconds less the device thread's CPU seconds."""
        wait = self.device_wait_seconds()
        if wait is not None:
            return wait
        return max(self.device_busy_seconds() - self.device_cpu_seconds(), 0.0)

    def simulator_wait_seconds(self) -> float | None:
        """The simulator calls' run-queue wait inside the window (each call's share that
        falls inside it); None where a call did not measure it."""
        calls = [iv for iv in self.busy if iv.service == "environment"]
        if not calls or any(iv.wait_s is None for iv in calls):
            return None
        lo, hi = self.started_at, self.ended_at
        return sum((iv.wait_s or 0.0) * span_fraction(iv, lo, hi) for iv in calls)

    def simulator_interference_seconds(self) -> float:
        """Seconds of the window the device waited out because its simulators lost their
        cores: the simulators' run-queue wait, at most the seconds in which a simulator
        call ran while the device was idle (a wait hidden behind device work cost the
        phase nothing). Overlapping calls' waits add up, so the cap matters where
        several simulators run at once."""
        wait = self.simulator_wait_seconds()
        if not wait:
            return 0.0
        lo, hi = self.started_at, self.ended_at
        either = window_union_seconds(self.busy, (*DEVICE_SERVICES, "environment"), lo, hi)
        return min(wait, max(either - self.device_busy_seconds(), 0.0))

    def interference_seconds(self) -> float:
        """Seconds of the window lost to other threads and processes: the device's own
        (:meth:`device_interference_seconds`) and its simulators' while it waited for
        them (:meth:`simulator_interference_seconds`), never so much that the device
        time left falls below what the device itself computed (:meth:`device_floor_s`).

        The waits are summed per thread, so two device threads waiting at once (a
        training step and an inference batch, both ready on the device's one core), or
        a device thread and a simulator, count the same lost second twice; the floor
        keeps that from taking out time the device was provably busy."""
        total = self.device_interference_seconds() + self.simulator_interference_seconds()
        return min(total, max(self.window_s - self.device_floor_s(), 0.0))

    def device_floor_s(self) -> float:
        """The least device time the window can have held: the device threads' CPU
        seconds over the device's cores (they cannot run on more at once), at most the
        window; 0 where no device span was recorded."""
        if not self.device_spans:
            return 0.0
        cores = len(self.device_cores) if self.device_cores else (os.cpu_count() or 1)
        return min(self.device_cpu_seconds() / cores, self.window_s)

    def training_grouping(self) -> dict[str, float | None]:
        """How the window's training steps were grouped, and what a row cost the device.

        Returns:
            ``steps`` and ``rows`` inside the window, ``rows_per_step``,
            ``device_cpu_ms_per_row``: the device threads' CPU seconds (training and
            inference alike) over the training rows, ``device_sys_share``: the kernel's
            share of that CPU, and ``device_minor_faults_per_row`` (None where not
            measured, or without rows).
        """
        lo, hi = self.started_at, self.ended_at
        rows = [r for t, r in self.step_rows if lo <= t <= hi + 1e-6]
        total = float(sum(rows))
        cpu = self.device_cpu_seconds() if self.device_spans else None
        spans = self.device_spans
        measured = bool(spans) and all(sp.sys_s is not None for sp in spans)
        sys_s = sum((sp.sys_s or 0.0) * span_fraction(sp, lo, hi) for sp in spans)
        faults = sum((sp.minor_faults or 0) * span_fraction(sp, lo, hi) for sp in spans)
        return {
            "steps": float(len(rows)),
            "rows": total,
            "rows_per_step": total / len(rows) if rows else None,
            "device_cpu_ms_per_row": None if cpu is None or not total else cpu / total * 1e3,
            "device_sys_share": sys_s / cpu if measured and cpu else None,
            "device_minor_faults_per_row": faults / total if measured and total else None,
        }

    @property
    def own_window_s(self) -> float:
        """The window less the interference: the device time the phase needed had its
        work run whenever it was ready."""
        return max(self.window_s - self.interference_seconds(), 1e-9)


def span_fraction(span: DeviceSpan | Interval, start: float, end: float) -> float:
    """The share of ``span`` (a device span or a busy interval) inside ``[start, end]``
    (an instant span: 1 inside, else 0)."""
    length = span.end - span.start
    if length <= 0:
        return 1.0 if start <= span.end <= end else 0.0
    return max(min(span.end, end) - max(span.start, start), 0.0) / length


def window_busy_seconds(
    intervals: Sequence[Interval], service: str, start: float, end: float
) -> float:
    """Sum of the parts of ``service``'s intervals that fall inside ``[start, end]``."""
    total = 0.0
    for iv in intervals:
        if iv.service != service:
            continue
        lo, hi = max(iv.start, start), min(iv.end, end)
        if hi > lo:
            total += hi - lo
    return total


def window_union_seconds(
    intervals: Sequence[Interval], services: Sequence[str], start: float, end: float
) -> float:
    """Length of the union of ``services``' intervals inside ``[start, end]`` (overlaps
    counted once: a training step and an inference batch timed at once share the device)."""
    spans = sorted(
        (max(iv.start, start), min(iv.end, end))
        for iv in intervals
        if iv.service in services and min(iv.end, end) > max(iv.start, start)
    )
    total, reach = 0.0, start
    for lo, hi in spans:
        lo = max(lo, reach)
        if hi > lo:
            total += hi - lo
            reach = hi
    return total


def _window_end(jobs: Sequence[JobRecord], matched: Mapping[str, int]) -> float | None:
    """Completion time of the last matched update: the ``matched[t]``-th completion of
    every tenant ``t``, whichever is latest."""
    ends: list[float] = []
    for tenant, n in matched.items():
        done = sorted(
            j.finished_at
            for j in jobs
            if j.tenant_id == tenant and j.state == JobState.COMPLETED.value and j.finished_at
        )
        if n <= 0:
            continue
        if len(done) < n:
            return None
        ends.append(done[n - 1])
    return max(ends) if ends else None


def shortfall(name: str, summary: RunSummary, matched: Mapping[str, int]) -> JoyNexusError:
    """The error of a phase that ended without its matched work: which tenants failed
    and why (their workloads' errors), or which fell short, and what to try.

    A failed simulator makes it an :class:`EnvironmentServiceError`; anything else an
    :class:`InternalError` (the phase's loops ended early with no reason given).
    """
    failed = {t: s.errors for t, s in summary.tenants.items() if s.state == "failed"}
    short = {
        t: f"{summary.tenants[t].jobs_completed if t in summary.tenants else 0} of {n}"
        for t, n in matched.items()
        if n > 0 and (summary.tenants[t].jobs_completed if t in summary.tenants else 0) < n
    }
    parts = [f"{t} failed: {'; '.join(errs) or 'no reason given'}" for t, errs in failed.items()]
    parts += [f"{t} completed {what} updates" for t, what in short.items() if t not in failed]
    what = "; ".join(parts) or "no training tenant completed an update"
    message = f"phase {name} ended without its matched work, nothing to compare: {what}"
    text = " ".join(" ".join(errs) for errs in failed.values())
    if "simulator" in text:
        if "did not answer" in text:
            # Seen on a 2-core machine under a load of 12 to 20: the paper's simulators
            # took longer than the Environment Service allows to start.
            message += (
                ". The simulators answered too slowly, as on a heavily loaded machine: "
                "rerun when it is quieter, or with the faster simulators (--envs fast)"
            )
        return EnvironmentServiceError(message, phase=name, failed=failed, short=short)
    return InternalError(message, phase=name, failed=failed, short=short)


def _loops_started(run: LocalRun) -> float | None:
    """Wall-clock time of the first ``running`` lifecycle record of the run's workloads
    (written by the Master when a workload's producer or evaluator starts)."""
    assert run.master is not None
    times = [
        float(r["time"])
        for tenant, wid in run.workload_ids.items()
        for r in run.master.reporter.metrics(tenant, wid, kind="lifecycle").records
        if r.get("state") == "running" and r.get("time") is not None
    ]
    return min(times) if times else None


async def run_phase(
    name: str,
    specs: Sequence[WorkloadSpec],
    run_dir: Path,
    *,
    matched: Mapping[str, int] | None = None,
    fill_tenants: Sequence[str] = (),
    on_progress: Callable[[list[TenantProgress]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    on_record_episode: Callable[[str, int, int, bool], None] | None = None,
    config: RuntimeConfig | None = None,
) -> PhaseTrace:
    """Run ``specs`` to their completion targets and return the phase's trace.

    Args:
        name: Label of the phase.
        specs: The workloads (they all run concurrently on one in-process Master).
        run_dir: This phase's run directory; its state is deleted first (``fresh``).
        matched: Updates per tenant that count (the window ends at the last of them);
            default: every completed update of every training tenant not in
            ``fill_tenants``.
        fill_tenants: SFT tenants that fill the actor's idle time (§5.1): once every
            other training tenant is done, their admission closes (completion target =
            0, so nothing new is reserved) and their matched work is the updates they
            completed inside the window.
        config: Plane knobs (default: :class:`RuntimeConfig`'s; the demo passes the
            simulator workers' cores).

    Raises:
        SpecError / DatasetError: a bad spec, before anything starts.
        EnvironmentServiceError / InternalError: the run ended without the updates
            ``matched`` asks for (see :func:`shortfall`).
    """
    compiled = compile_workloads(list(specs))
    fill = set(fill_tenants)
    closed: list[str] = []
    busy: list[Interval] = []
    started: list[float] = []

    def status(msg: str) -> None:
        if msg == "running" and not started:
            started.append(time.time())
        if on_status is not None:
            on_status(msg)

    sim_waits: dict[str | None, float] = {}  # a call's wait, until its latency event
    step_rows: list[tuple[float, float]] = []

    def on_event(e: MetricEvent) -> None:
        if e.name == SIM_WAIT_EVENT:
            sim_waits[e.tenant_id] = e.value
            return
        if e.name == STEP_ROWS_EVENT:
            step_rows.append((e.timestamp, e.value))
            return
        service = BUSY_EVENTS.get(e.name)
        if service is not None:
            wait = sim_waits.pop(e.tenant_id, None) if service == "environment" else None
            busy.append(Interval(service, e.timestamp - e.value, e.timestamp, e.tenant_id, wait))

    wipe_run_state(run_dir)  # fresh: nothing of an earlier run resumes or is counted
    run = LocalRun(run_dir, config=config)
    recorder = SpanRecorder()
    probe = LoadProbe()

    def progress(rows: list[TenantProgress]) -> None:
        lead = [r for r in rows if r.task in ("rl", "sft") and r.tenant not in fill]
        if fill and not closed and lead and all(r.done for r in lead):
            assert run.plane is not None
            for w in compiled.workloads:
                if w.tenant_id in fill and w.admission is not None:
                    policy = w.admission.model_copy(update={"completion_target": 0})
                    run.plane.scheduler.set_policy(w.tenant_id, TaskType.SFT, policy)
                    closed.append(w.tenant_id)
        if on_progress is not None:
            on_progress(rows)

    try:
        recorder.start()
        await record_missing_datasets(
            compiled, on_status=status, on_record_episode=on_record_episode
        )
        await run.open(compiled, status=status)
        assert run.plane is not None and run.master is not None
        if run.plane.metrics is None or run.plane.usage is None:
            raise RuntimeError(f"phase {name}: the plane has no Metrics Service / usage meter")
        meter = run.plane.usage
        # Subscribed before any workload is submitted: no busy interval is missed.
        run.plane.metrics.subscribe(on_event, categories=["system"], name="demo-busy")
        run.write_event_files()
        status("starting tenants and environment sessions")
        await run.submit_all(compiled)
        status("running")
        probe.start()
        await run.wait(progress)
        machine = await probe.stop()
        summary = run.summary()
        jobs = [
            JobRecord(
                tenant_id=j.tenant_id,
                task=j.task_type.value,
                state=j.state.value,
                leased_at=j.timestamps.leased_at,
                finished_at=j.timestamps.finished_at,
            )
            for j in run.plane.scheduler.list_jobs()
        ]
        records: dict[str, list[dict[str, Any]]] = {}
        for tenant, wid in run.workload_ids.items():
            wt = run.master.reporter.tenant_of(wid)
            records[tenant] = list(wt.metrics.records) if wt is not None else []
        loops_started = _loops_started(run)
        predict_stages = run.plane.metrics.stages.snapshot()
    finally:
        try:
            await run.close()  # delivers the buffered events to the busy sink
        finally:
            await probe.stop()
            recorder.stop()
    usage = meter.snapshot()  # after close: the services are stopped, nothing more lands
    if matched is None:
        matched = {
            t: s.jobs_completed
            for t, s in summary.tenants.items()
            if s.task in ("rl", "sft") and t not in fill
        }
    end = _window_end(jobs, matched)
    if end is not None and fill:
        matched = dict(matched)
        for t in sorted(fill):
            matched[t] = sum(
                1
                for j in jobs
                if j.tenant_id == t
                and j.state == JobState.COMPLETED.value
                and j.finished_at is not None
                and j.finished_at <= end
            )
    if end is None:
        raise shortfall(name, summary, matched)
    if loops_started is not None:
        start = loops_started
    elif started:
        start = started[0]
    else:
        start = min((iv.start for iv in busy), default=end)
    return PhaseTrace(
        name=name,
        run_dir=run_dir,
        started_at=start,
        ended_at=end,
        wall_s=summary.wall_s,
        busy=sorted(busy, key=lambda iv: iv.start),
        jobs=jobs,
        usage=usage,
        records=records,
        summary=summary,
        matched=dict(matched),
        predict_stages=predict_stages,
        device_spans=sorted(recorder.spans, key=lambda sp: sp.start),
        machine=machine,
        device_cores=None if (cores := pinned_device_cores()) is None else sorted(cores),
        step_rows=sorted(step_rows),
    )
