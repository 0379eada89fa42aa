"""Which experiment trackers a run writes to, and where (``tracking`` in a spec, the CLI).

A workload spec's ``tracking`` names the trackers its tenant's learning curves go to
(default: TensorBoard); ``joynexus run --tracking NAME`` and ``joynexus serve
--tracking NAME`` add a tracker for every tenant. Every tracker writes under the run
directory and needs no server: TensorBoard event files in ``tensorboard/``, W&B offline
runs in ``wandb/``, an MLflow file store in ``mlruns/``, a ClearML offline session in
``clearml/``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from joynexus.errors import SpecError
from joynexus.metrics.events import MetricsService
from joynexus.spec.workload import TRACKERS, TrackerName

__all__ = ["TRACKERS", "TrackerName", "build_tracker", "subscribe_trackers", "tracker_dir"]

_DIRS: dict[str, str] = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlruns",
    "clearml": "clearml",
}


def tracker_dir(run_dir: Path, name: TrackerName) -> Path:
    """Where tracker ``name`` writes in ``run_dir``."""
    return run_dir / _DIRS[name]


def build_tracker(name: TrackerName, run_dir: Path) -> Any:
    """The sink of tracker ``name`` writing under ``run_dir`` (offline where it can be).

    Raises:
        SpecError: the tracker's package is missing (with what installs it).
    """
    from joynexus.metrics import trackers

    where = tracker_dir(run_dir, name)
    try:
        if name == "tensorboard":
            return trackers.TensorBoardSink(where)
        if name == "wandb":
            return trackers.WandbSink("joynexus", where, mode="offline")
        if name == "mlflow":
            return trackers.MLflowSink(where)
        return trackers.ClearMLSink(where, offline=True)
    except ImportError as exc:
        raise SpecError(
            f"tracker {name!r} needs its package ({exc}); `make install` or "
            "`pip install 'joynexus[trackers]'` installs every tracker"
        ) from exc


def subscribe_trackers(
    metrics: MetricsService,
    run_dir: Path,
    *,
    everyone: Iterable[TrackerName] = (),
    by_tenant: Mapping[str, Collection[TrackerName]] | None = None,
) -> dict[TrackerName, Any]:
    """Subscribe one sink per tracker in use; each writes the tenants that chose it.

    Args:
        everyone: Trackers every tenant's events go to (the CLI's ``--tracking``).
        by_tenant: Each tenant's own choice (its workload spec's ``tracking``).

    Returns:
        The sinks by tracker (close them when the run ends).
    """
    chosen = dict(by_tenant or {})
    for_all = set(everyone)
    names = for_all | {n for picks in chosen.values() for n in picks}
    sinks: dict[TrackerName, Any] = {}
    for name in sorted(names):
        sink = build_tracker(name, run_dir)
        if name not in for_all:
            wanted = frozenset(t for t, picks in chosen.items() if name in picks)
            sink.tenants = lambda tenant, wanted=wanted: tenant in wanted
        metrics.subscribe(sink, name=name)
        sinks[name] = sink
    return sinks
