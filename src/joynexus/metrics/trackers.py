"""Experiment-tracker sinks for learning signals: TensorBoard (default), W&B, MLflow,
ClearML.

Each tenant gets its own run (TensorBoard: its own log directory; ClearML, which allows
one task per process, its own series of every metric), so a tenant's curves never mix
with another's. The tag is the event name, with any labels appended
(``eval.success_rate/task:push``); the step is the event's step (the policy version)
or, when absent, a per-tag counter.

The tracker libraries are imported when a sink is built, not when this module is: W&B
MLflow and ClearML are extras (``pip install joynexus[trackers]``; ``make install``
installs them).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Literal

from joynexus.metrics.events import MetricCategory, MetricEvent

__all__ = ["ClearMLSink", "MLflowSink", "TensorBoardSink", "WandbSink", "tag_of"]

SERVICE_RUN = "_service"
_DEFAULT_CATEGORIES: frozenset[str] = frozenset({"learning"})


def tag_of(event: MetricEvent) -> str:
    if not event.labels:
        return event.name
    # "/" and ":" are the separators every tracker accepts in a metric name (MLflow's
    # rules are the strictest).
    return event.name + "/" + "/".join(f"{k}:{v}" for k, v in sorted(event.labels.items()))


class _PerRunSink:
    """Shared bookkeeping: category filter, one run per tenant, implicit steps."""

    def __init__(self, categories: Collection[MetricCategory] | None) -> None:
        self._categories = frozenset(categories) if categories is not None else _DEFAULT_CATEGORIES
        self._steps: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        #: Which tenants' events this sink writes (None: everyone's); a workload spec's
        #: ``tracking`` selects the trackers of its tenant.
        self.tenants: Callable[[str | None], bool] | None = None

    def _step(self, run: str, e: MetricEvent) -> int:
        if e.step is not None:
            return e.step
        key = (run, tag_of(e))
        n = self._steps.get(key, 0)
        self._steps[key] = n + 1
        return n

    def handle(self, events: Sequence[MetricEvent]) -> None:
        with self._lock:
            for e in events:
                if e.category in self._categories and (
                    self.tenants is None or self.tenants(e.tenant_id)
                ):
                    run = e.tenant_id or SERVICE_RUN
                    self._write(run, e, self._step(run, e))
            self._flush()

    def _write(self, run: str, e: MetricEvent, step: int) -> None:
        raise NotImplementedError

    def _flush(self) -> None:
        return None


class TensorBoardSink(_PerRunSink):
    """Writes TensorBoard event files to ``<log_dir>/<tenant_id>/``.

    Args:
        log_dir: Root directory (``tensorboard --logdir`` points here).
        categories: Categories written (default: learning).
    """

    def __init__(
        self, log_dir: str | Path, *, categories: Collection[MetricCategory] | None = None
    ) -> None:
        super().__init__(categories)
        from torch.utils.tensorboard import SummaryWriter

        self._writer_cls = SummaryWriter
        self.log_dir = Path(log_dir)
        self._writers: dict[str, Any] = {}

    def run_dir(self, tenant_id: str | None) -> Path:
        return self.log_dir / (tenant_id or SERVICE_RUN)

    def _write(self, run: str, e: MetricEvent, step: int) -> None:
        writer = self._writers.get(run)
        if writer is None:
            writer = self._writers[run] = self._writer_cls(log_dir=str(self.log_dir / run))
        writer.add_scalar(tag_of(e), e.value, global_step=step, walltime=e.timestamp)

    def _flush(self) -> None:
        for w in self._writers.values():
            w.flush()

    def close(self) -> None:
        with self._lock:
            for w in self._writers.values():
                w.close()
            self._writers.clear()


class WandbSink(_PerRunSink):
    """Logs to Weights & Biases, one run per tenant; offline by default (no network).

    Args:
        project: W&B project.
        log_dir: Where the offline runs are written (``<log_dir>/wandb/``).
        mode: ``offline`` (default), ``online`` or ``disabled``.
        group: Run group (e.g. the workload name).
        categories: Categories logged (default: learning).
    """

    def __init__(
        self,
        project: str,
        log_dir: str | Path,
        *,
        mode: Literal["online", "offline", "disabled"] = "offline",
        group: str | None = None,
        categories: Collection[MetricCategory] | None = None,
    ) -> None:
        super().__init__(categories)
        import wandb

        self._wandb = wandb
        self.project = project
        self.log_dir = Path(log_dir)
        self.mode = mode
        self.group = group
        self.runs: dict[str, Any] = {}

    def _run(self, run: str) -> Any:
        r = self.runs.get(run)
        if r is None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            r = self._wandb.init(
                project=self.project,
                dir=str(self.log_dir),
                mode=self.mode,
                name=run,
                group=self.group,
                config={"tenant_id": run},
                reinit="create_new",
                settings=self._wandb.Settings(silent=True, console="off", x_disable_stats=True),
            )
            self.runs[run] = r
        return r

    def _write(self, run: str, e: MetricEvent, step: int) -> None:
        # W&B's own step must increase monotonically per run; events of different tags
        # arrive with independent steps, so the event's step travels as a field.
        self._run(run).log({tag_of(e): e.value, "step": step})

    def close(self) -> None:
        with self._lock:
            for r in self.runs.values():
                r.finish()
            self.runs.clear()


class MLflowSink(_PerRunSink):
    """Logs to MLflow, one run per tenant in one experiment.

    Args:
        tracking_uri: MLflow tracking URI; a local directory means its file store.
        experiment: Experiment name (created if missing).
        categories: Categories logged (default: learning).
    """

    def __init__(
        self,
        tracking_uri: str | Path,
        *,
        experiment: str = "joynexus",
        categories: Collection[MetricCategory] | None = None,
    ) -> None:
        super().__init__(categories)
        uri = str(tracking_uri)
        if isinstance(tracking_uri, Path) or ("://" not in uri and not uri.startswith("file:")):
            uri = Path(uri).resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 refuses its file store unless asked explicitly; a local directory is
            # what this adapter is for (no database or server to run).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        self._metric_cls = Metric
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id: str = (
            found.experiment_id if found is not None else self.client.create_experiment(experiment)
        )
        self.run_ids: dict[str, str] = {}
        self._pending: dict[str, list[Any]] = {}

    def _run_id(self, run: str) -> str:
        rid = self.run_ids.get(run)
        if rid is None:
            created = self.client.create_run(
                self.experiment_id, run_name=run, tags={"tenant_id": run}
            )
            rid = self.run_ids[run] = created.info.run_id
        return rid

    def _write(self, run: str, e: MetricEvent, step: int) -> None:
        metric = self._metric_cls(tag_of(e), e.value, int(e.timestamp * 1000), step)
        self._pending.setdefault(self._run_id(run), []).append(metric)

    def _flush(self) -> None:
        for rid, metrics in self._pending.items():
            # log_batch takes at most 1000 metrics per call.
            for i in range(0, len(metrics), 1000):
                self.client.log_batch(rid, metrics=metrics[i : i + 1000])
        self._pending.clear()

    def close(self) -> None:
        with self._lock:
            self._flush()
            for rid in self.run_ids.values():
                self.client.set_terminated(rid)
            self.run_ids.clear()


#: ClearML settings of an offline session: metrics reported in this process (its
#: default reporter subprocess makes every close wait seconds for a poll).
_CLEARML_OFFLINE_CONF = "sdk { development { report_use_subprocess: false } }\n"


class ClearMLSink(_PerRunSink):
    """Logs to ClearML; offline by default (no server: a session folder and zip).

    ClearML allows one task per process, so the run is one task and each tenant is a
    series of every metric (``report_scalar(title=tag, series=tenant)``).

    Args:
        log_dir: Where the offline session is written (``<log_dir>/offline/<task id>``,
            zipped on :meth:`close`); ClearML's cache directory of this process.
        project / task_name: The ClearML project and task.
        offline: False reports to the ClearML server of ``clearml.conf`` instead.
        categories: Categories logged (default: learning).
    """

    def __init__(
        self,
        log_dir: str | Path,
        *,
        project: str = "joynexus",
        task_name: str = "run",
        offline: bool = True,
        categories: Collection[MetricCategory] | None = None,
    ) -> None:
        super().__init__(categories)
        self.log_dir = Path(log_dir)
        if offline:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            conf = self.log_dir / "clearml.conf"
            conf.write_text(_CLEARML_OFFLINE_CONF)
            # ClearML reads where it writes from the environment only (before import);
            # a user's own configuration file wins.
            os.environ["CLEARML_CACHE_DIR"] = str(self.log_dir.resolve())
            os.environ.setdefault("CLEARML_CONFIG_FILE", str(conf.resolve()))
        from clearml import Task

        Task.set_offline(offline_mode=offline)
        self.task: Any = Task.init(
            project_name=project,
            task_name=task_name,
            reuse_last_task_id=False,
            auto_connect_arg_parser=False,
            auto_connect_frameworks=False,
            auto_resource_monitoring=False,
            auto_connect_streams=False,
        )
        self._logger: Any = self.task.get_logger()
        self._closed = False

    @property
    def session_dir(self) -> Path | None:
        """The offline session's folder (None online)."""
        folder = self.task.get_offline_mode_folder()  # ClearML's own Path class
        return None if folder is None else Path(str(folder))

    def _write(self, run: str, e: MetricEvent, step: int) -> None:
        self._logger.report_scalar(tag_of(e), run, value=e.value, iteration=step)

    def _flush(self) -> None:
        self._logger.flush()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self.task.close()  # zips the offline session
