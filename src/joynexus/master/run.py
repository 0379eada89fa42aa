"""Run workloads to completion on an in-process Master (``joynexus run``, the demo).

:class:`LocalRun` is the Master Service of one run directory, hosted in this process:
it builds the execution plane (:func:`~joynexus.runtime.plane.build_plane`), opens the
durable workload store in the run directory, starts the Master (which resumes whatever
a previous invocation left running) and submits the specs. A spec identical to a
workload already recorded in the run directory is *that* workload again — resumed if
it was interrupted, reported as it ended otherwise — so rerunning a command continues
the same checkpoint and the same job history together, and never counts another run's
jobs. ``fresh=True`` deletes the run directory's state first (workload records, job
history, checkpoints, metrics and usage) and starts both over.

Everything of a run lives in its run directory: ``scheduler.sqlite`` (jobs and
workload records), ``outputs/<tenant>/`` (checkpoints, each workload's metrics),
``usage.json`` and the tiny-model cache ``models/`` (kept by ``fresh``).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from joynexus.api import WorkloadState, WorkloadStatus
from joynexus.data.record import record_missing_dataset
from joynexus.master.host import MasterHost
from joynexus.master.limits import MasterLimits
from joynexus.master.service import MasterService
from joynexus.master.store import SQLiteWorkloadStore
from joynexus.runtime.health import HealthManager
from joynexus.runtime.hosting import InProcess, Placement
from joynexus.runtime.plane import ExecutionPlane, RuntimeConfig, build_plane, load_base_model
from joynexus.spec.workload import TaskKind, TrackerName, WorkloadSpec
from joynexus.utils.clock import Clock, SystemClock
from joynexus.workflows.compile import CompiledRun, compile_workloads
from joynexus.workflows.success import recorded_measure
from joynexus.workflows.summary import EvalRunSummary, RunSummary, TenantProgress, TenantSummary

__all__ = [
    "RUN_STATE",
    "LocalRun",
    "record_missing_datasets",
    "run_workloads",
    "wipe_run_state",
]

log = logging.getLogger(__name__)

#: What ``fresh`` deletes from a run directory (the model cache stays).
RUN_STATE = (
    "scheduler.sqlite",
    "scheduler.sqlite-wal",
    "scheduler.sqlite-shm",
    "usage.json",
    "outputs",
    "metrics",
    # What the experiment trackers wrote (joynexus.metrics.tracking).
    "tensorboard",
    "wandb",
    "mlruns",
    "clearml",
)


def wipe_run_state(run_dir: Path) -> None:
    """Delete a run directory's job history, workload records, checkpoints and usage."""
    for name in RUN_STATE:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _comparable(spec: WorkloadSpec) -> dict[str, Any]:
    data: dict[str, Any] = spec.model_dump(mode="json", by_alias=True, exclude={"output_dir"})
    return data


class LocalRun:
    """One run directory's Master, in this process (see module docstring).

    Args:
        run_dir: Holds everything of the run.
        config: Plane and loop knobs.
        clock: Time source (tests may pass their own).
        placement: Where the services live (default: in this process).
        limits: What the Master accepts (default: everything a local user may run).
        health_check_s: Period of the Health Manager's probes.
        recovery_budget: Restarts per role before the live workloads are failed.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        config: RuntimeConfig | None = None,
        clock: Clock | None = None,
        placement: Placement | None = None,
        limits: MasterLimits | None = None,
        health_check_s: float = 0.5,
        recovery_budget: int = 3,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.config = config or RuntimeConfig()
        self.clock: Clock = clock or SystemClock()
        self.placement: Placement = placement or InProcess()
        self.limits = limits
        # Probes and crash reports only: nothing in a run sends heartbeats.
        self.health = HealthManager(
            self.clock,
            default_budget=recovery_budget,
            heartbeat_timeout_s=None,
            check_interval_s=health_check_s,
        )
        self.host: MasterHost | None = None
        self.plane: ExecutionPlane | None = None
        self.master: MasterService | None = None
        self.workload_ids: dict[str, str] = {}  # tenant -> its workload of this run
        # Tracker name -> its sink; the Metrics Service closes them when the run stops.
        self.trackers: dict[str, Any] = {}
        self.started_at = time.monotonic()

    async def open(self, compiled: CompiledRun, *, status: Callable[[str], None]) -> None:
        """Load the base model, build the plane, start the Master (recovering)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        status(f"loading base model {compiled.base_model.id}")
        base = await asyncio.to_thread(
            load_base_model, compiled.base_model, self.run_dir / "models"
        )
        self.plane = build_plane(
            self.run_dir,
            compiled.base_model,
            placement=self.placement,
            config=self.config,
            clock=self.clock,
            base=base,
            keep_in_flight=True,
        )
        roots = sorted(
            {w.spec.dataset.path.resolve().parent for w in compiled.workloads if w.spec.dataset}
        )
        # A single-user run: the file's author owns the machine, so the sub-envs it
        # declares are its own choice, not a hosted server's cap.
        envs = [w.spec.env.num_envs for w in compiled.workloads if w.spec.env is not None]
        limits = self.limits or MasterLimits(
            dataset_roots=roots,
            tenant_datasets=False,
            max_num_envs=max([MasterLimits().max_num_envs, *envs]),
            denied_env_kinds=[],
            cross_tenant_eval=True,
            max_active_workloads_per_tenant=max(2, len(compiled.workloads)),
        )
        self.host = MasterHost(
            self.plane,
            store=SQLiteWorkloadStore(self.run_dir / "scheduler.sqlite"),
            output_root=self.run_dir / "outputs",
            limits=limits,
            config=self.config,
            clock=self.clock,
            health=self.health,
        )
        self.master = self.host.master
        await self.host.start()

    async def submit_all(self, compiled: CompiledRun) -> dict[str, str]:
        """Submit each workload unless the run directory already holds it; tenant → id.

        Trainable workloads go first: an evaluation reads their slots.
        """
        master = self.master
        assert master is not None
        order = sorted(compiled.workloads, key=lambda w: w.task is TaskKind.EVAL)
        for w in order:
            wid = self._recorded(w.spec)
            if wid is None:
                wid = (await master.lifecycle.submit(w.spec, w.tenant_id)).workload_id
            self.workload_ids[w.tenant_id] = wid
        return dict(self.workload_ids)

    def _recorded(self, spec: WorkloadSpec) -> str | None:
        """The newest recorded workload with this exact spec (not cancelled)."""
        assert self.master is not None
        reporter = self.master.reporter
        want = _comparable(spec)
        for wid in reversed(reporter.workload_ids()):
            st = reporter.status(spec.tenant, wid) if self._owner(wid) == spec.tenant else None
            if st is None or st.state is WorkloadState.CANCELLED:
                continue
            if _comparable(WorkloadSpec.model_validate(reporter.spec_of(spec.tenant, wid))) == want:
                return wid
        return None

    def write_event_files(self) -> None:
        """Also write the Metrics Service's events into the run directory (after
        :meth:`open`, before :meth:`submit_all`, so no event is missed).

        Every event of a tenant goes to ``<run_dir>/metrics/<tenant>/metrics.jsonl``
        (service-wide ones to ``<run_dir>/metrics/service.jsonl``) and learning curves
        to TensorBoard under ``<run_dir>/tensorboard``. Both are run state
        (:data:`RUN_STATE`): ``fresh`` deletes them.
        """
        from joynexus.metrics.jsonl import TenantJsonlSink

        metrics = self.plane.metrics if self.plane is not None else None
        if metrics is None:
            raise RuntimeError("write_event_files: the run is not open (or has no metrics)")
        root = self.run_dir / "metrics"
        metrics.subscribe(TenantJsonlSink(root, service_path=root / "service.jsonl"), name="jsonl")
        try:
            from joynexus.metrics.trackers import TensorBoardSink

            metrics.subscribe(TensorBoardSink(self.run_dir / "tensorboard"), name="tensorboard")
        except ImportError as exc:  # tensorboard is a core dependency; a broken install
            log.warning("TensorBoard sink disabled: %s", exc)

    def _owner(self, workload_id: str) -> str | None:
        assert self.master is not None
        tenant = self.master.reporter.tenant_owner(workload_id)
        return tenant

    def statuses(self) -> dict[str, WorkloadStatus]:
        assert self.master is not None
        return {t: self.master.reporter.status(t, wid) for t, wid in self.workload_ids.items()}

    def progress(self) -> list[TenantProgress]:
        """One progress row per workload of this run."""
        rows = []
        for t, st in self.statuses().items():
            if st.task == "eval":
                completed, target, version = st.eval_runs_completed, st.eval_runs_target, None
            else:
                completed, target, version = st.jobs_completed, st.jobs_target, st.policy_version
            rows.append(
                TenantProgress(
                    tenant=t,
                    task=st.task,
                    completed=completed,
                    target=target,
                    version=version,
                    done=st.state.is_terminal,
                )
            )
        return rows

    async def wait(self, on_progress: Callable[[list[TenantProgress]], None] | None = None) -> None:
        """Wait until every workload of this run ended."""
        while True:
            rows = self.progress()
            if on_progress is not None:
                on_progress(rows)
            if all(r.done for r in rows):
                return
            await self.clock.sleep(0.1)

    def summary(self) -> RunSummary:
        """The run summary (``joynexus run --json``)."""
        master = self.master
        assert master is not None
        out: dict[str, TenantSummary] = {}
        for t, st in self.statuses().items():
            wid = self.workload_ids[t]
            records = master.reporter.metrics(t, wid).records
            errors = [st.error] if st.error else []
            tenant = master.reporter.tenant_of(wid)
            if tenant is not None:
                errors += tenant.errors[:20]
            s = TenantSummary(
                task=st.task,
                state=st.state.value,
                jobs_completed=st.jobs_completed,
                jobs_dropped=st.jobs_dropped,
                jobs_failed=st.jobs_failed,
                errors=errors[:20],
                output_dir=str(master.book.tenant_dir(t)),
            )
            resumed = [r["policy_version"] for r in records if r.get("kind") == "resumed"]
            s.resumed_from_version = int(resumed[0]) if resumed else None
            if st.task != "eval":
                s.final_version = st.policy_version
                _add_success(s, records)
            if st.task == "sft":
                held = [r for r in records if r.get("kind") == "heldout"]
                first = [r for r in records if r.get("kind") == "heldout_initial"]
                s.sft_heldout_error_initial = first[0].get("error") if first else None
                s.sft_heldout_error_final = held[-1].get("final") if held else None
            elif st.task == "rl":
                rets = [
                    r["mean_return"]
                    for r in records
                    if r.get("kind") == "rollout" and r.get("mean_return") is not None
                ]
                s.rl_return_initial = float(rets[0]) if rets else None
                s.rl_return_final = float(rets[-1]) if rets else None
            elif st.task == "eval":
                runs = [
                    EvalRunSummary(
                        run=int(r["run"]),
                        target=str(r["target"]),
                        version=int(r["version"]),
                        versions_seen=list(r.get("versions_seen") or []),
                        episodes=int(r["episodes"]),
                        success_rate=float(r["success_rate"]),
                        mean_return=float(r["mean_return"]),
                        success_ci95=tuple(r["success_ci95"]) if r.get("success_ci95") else None,
                        per_task=r.get("per_task"),
                        seeds=r.get("seeds"),
                    )
                    for r in records
                    if r.get("kind") == "eval"
                ]
                s.eval_runs = runs
                if runs:
                    last = max(r.run for r in runs)
                    s.eval_success_rate = float(
                        np.mean([r.success_rate for r in runs if r.run == last])
                    )
            out[t] = s
        return RunSummary(
            run_dir=str(self.run_dir), wall_s=time.monotonic() - self.started_at, tenants=out
        )

    def track(self, compiled: CompiledRun, everyone: Sequence[TrackerName] = ()) -> None:
        """Write learning curves to the trackers each spec's ``tracking`` names, and to
        ``everyone`` for every tenant (after :meth:`open`, before :meth:`submit_all`)."""
        from joynexus.metrics.tracking import subscribe_trackers

        if self.plane is None or self.plane.metrics is None:
            raise RuntimeError("track: the run is not open (or has no metrics)")
        by_tenant = {w.tenant_id: w.spec.tracking for w in compiled.workloads}
        sinks = subscribe_trackers(
            self.plane.metrics, self.run_dir, everyone=everyone, by_tenant=by_tenant
        )
        self.trackers = {str(name): sink for name, sink in sinks.items()}

    async def close(self) -> None:
        """Stop the Master and the services (records and checkpoints stay)."""
        if self.host is None:
            return
        try:
            await self.host.stop()
        finally:
            self.host.close()


def _add_success(s: TenantSummary, records: list[dict[str, Any]]) -> None:
    """The tenant's success rates before and after training, with their intervals."""
    initial = recorded_measure(records, "initial")
    final = recorded_measure(records, "final")
    if initial is not None:
        s.success_rate_initial = initial.success_rate
        s.success_rate_ci95_initial = initial.ci95
    if final is not None:
        s.success_rate_final = final.success_rate
        s.success_rate_ci95 = final.ci95
    last = final or initial
    if last is not None:
        s.eval_episodes = last.episodes
        s.eval_first_seed = last.first_seed


async def record_missing_datasets(
    compiled: CompiledRun,
    *,
    on_status: Callable[[str], None] | None = None,
    on_record_episode: Callable[[str, int, int, bool], None] | None = None,
) -> None:
    """Record every SFT dataset a workload needs and lacks, with the scripted expert.

    Args:
        compiled: The run's workloads.
        on_status: Told which dataset is recorded.
        on_record_episode: Called as ``(tenant, episode, frames, success)`` per episode.
    """
    status = on_status or (lambda _msg: None)
    for w in compiled.workloads:
        spec = w.spec
        if w.needs_recording and spec.dataset is not None and not spec.dataset.path.exists():
            assert spec.env is not None
            status(
                f"{w.tenant_id}: dataset {spec.dataset.path} is missing; recording "
                f"{spec.dataset.record_episodes} episodes of {spec.env.kind} with the "
                "scripted expert"
            )
            tid = w.tenant_id
            cb = None
            if on_record_episode is not None:
                cb = lambda ep, n, ok, tid=tid: on_record_episode(tid, ep, n, ok)  # noqa: E731
            rec = await asyncio.to_thread(record_missing_dataset, spec, cb)
            status(
                f"{w.tenant_id}: recorded {rec.episodes} episodes, {rec.frames} frames, "
                f"expert success rate {rec.success_rate:.0%}"
                + (" — these demonstrations never reach the goal" if rec.successes == 0 else "")
            )


async def run_workloads(
    specs: Sequence[WorkloadSpec] | CompiledRun,
    run_dir: str | Path,
    *,
    fresh: bool = False,
    config: RuntimeConfig | None = None,
    clock: Clock | None = None,
    placement: Placement | None = None,
    health_check_s: float = 0.5,
    recovery_budget: int = 3,
    on_progress: Callable[[list[TenantProgress]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    on_record_episode: Callable[[str, int, int, bool], None] | None = None,
    on_open: Callable[[LocalRun], None] | None = None,
    tracking: Sequence[TrackerName] = (),
) -> RunSummary:
    """Validate, then run every workload to its end on an in-process Master.

    Args:
        specs: The workloads (or already compiled ones); all checked before anything
            starts.
        run_dir: Everything of the run (see module docstring).
        fresh: Delete the run directory's state first and start over.
        placement: Where the services live (default: in this process).
        health_check_s / recovery_budget: The Health Manager's probe period and
            restarts per role before the live workloads are failed.
        on_progress / on_status / on_record_episode: Progress callbacks.
        on_open: Called with the run once its workloads are submitted (to adjust
            admission through ``run.plane.scheduler``, for instance).
        tracking: Experiment trackers for every tenant, beside each spec's own
            ``tracking`` (``--tracking``).

    Raises:
        SpecError / DatasetError: a bad spec, before anything starts.
    """
    compiled = specs if isinstance(specs, CompiledRun) else compile_workloads(list(specs))
    status = on_status or (lambda _msg: None)
    run_dir = Path(run_dir)
    if fresh:
        wipe_run_state(run_dir)
    await record_missing_datasets(compiled, on_status=status, on_record_episode=on_record_episode)
    run = LocalRun(
        run_dir,
        config=config,
        clock=clock,
        placement=placement,
        health_check_s=health_check_s,
        recovery_budget=recovery_budget,
    )
    try:
        await run.open(compiled, status=status)
        run.track(compiled, tracking)
        status("starting tenants and environment sessions")
        await run.submit_all(compiled)
        if on_open is not None:
            on_open(run)
        status("running")
        await run.wait(on_progress)
        return run.summary()
    finally:
        await run.close()
