"""Where the device goes in a phase: the gap between the achieved device-time ratio and
its bound, taken apart (issue 26, item 4).

The bound (:func:`joynexus.demo.report.device_time_bound`) assumes the multi-tenant run
keeps the device busy for exactly the isolated replays' device-busy seconds and never
idles. Its window is longer than that for two reasons only, and this module measures
both from the phase's trace:

* **stretch** — the same matched work kept the device busy longer than it did in the
  replays (on one CPU the services share cores with the simulators and the host's own
  Python; grouped inference may also shorten it, a negative stretch);
* **idle** — moments of the window in which neither a training step nor an inference
  batch ran. Each idle moment gets one cause, the first that holds:

  1. ``host_work_of_a_leased_job``: a training job is leased (its actor phase runs) but
     no step is on the device — data loading, collation, bookkeeping between steps;
  2. ``waiting_for_simulators``: a simulator is stepping and no job is leased — the RL
     tenants wait for their environments, with nothing to backfill the device;
  3. ``nothing_measured``: neither — the control plane, rollout shipping, start-up of a
     tenant's first session, or no work admitted.

``window = device-busy + idle``, and ``window - bound window = stretch + idle``, so the
parts add up to the whole shortfall; :func:`device_idle` reports them and a binned
timeline for the figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from joynexus.demo.phase import DEVICE_SERVICES, PhaseTrace

__all__ = ["IDLE_CAUSES", "device_idle", "idle_timeline", "split_stretch"]

#: Idle causes in the order they are tried (see the module docstring).
IDLE_CAUSES = ("host_work_of_a_leased_job", "waiting_for_simulators", "nothing_measured")

_DEVICE, _SIM, _JOB = 0, 1, 2


def _edges(trace: PhaseTrace) -> list[tuple[float, int, int]]:
    """(time, kind, +1 start / -1 end) for every interval clipped to the window."""
    lo, hi = trace.started_at, trace.ended_at
    spans: list[tuple[int, float, float]] = []
    for iv in trace.busy:
        kind = _DEVICE if iv.service in DEVICE_SERVICES else _SIM
        spans.append((kind, iv.start, iv.end))
    for job in trace.jobs:
        if job.leased_at is not None and job.finished_at is not None:
            spans.append((_JOB, job.leased_at, job.finished_at))
    edges: list[tuple[float, int, int]] = []
    for kind, start, end in spans:
        s, e = max(start, lo), min(end, hi)
        if e > s:
            edges += [(s, kind, 1), (e, kind, -1)]
    edges.sort()
    return edges


def _segments(trace: PhaseTrace) -> Iterable[tuple[float, float, str | None]]:
    """Consecutive pieces of the window: (start, end, None if the device is busy, else
    the idle cause)."""
    counts = [0, 0, 0]
    t = trace.started_at
    for when, kind, step in [*_edges(trace), (trace.ended_at, _DEVICE, 0)]:
        if when > t:
            if counts[_DEVICE] > 0:
                cause = None
            elif counts[_JOB] > 0:
                cause = IDLE_CAUSES[0]
            elif counts[_SIM] > 0:
                cause = IDLE_CAUSES[1]
            else:
                cause = IDLE_CAUSES[2]
            yield t, when, cause
            t = when
        counts[kind] += step


def idle_timeline(trace: PhaseTrace, bins: int = 60) -> dict[str, list[float]]:
    """Per bin of the window: the fraction of it the device was busy and idle by cause
    (``t`` holds the bins' centres in seconds from the window's start)."""
    width = trace.window_s / bins
    out: dict[str, list[float]] = {
        "t": [(k + 0.5) * width for k in range(bins)],
        "busy": [0.0] * bins,
    }
    for name in IDLE_CAUSES:
        out[name] = [0.0] * bins
    for start, end, cause in _segments(trace):
        a, b = start - trace.started_at, end - trace.started_at
        k = min(int(a / width), bins - 1)
        while a < b - 1e-12 and k < bins:
            piece = min(b, (k + 1) * width) - a
            out["busy" if cause is None else cause][k] += piece / width
            a += piece
            k += 1
    return out


def split_stretch(
    busy: list[float], device_busy_s: float, isolated_device_busy_s: float
) -> tuple[list[float], list[float]]:
    """Split each bin's busy fraction into the replays' device work and stretch.

    Stretch is a total over the window (the same work, longer on the device), not a
    moment one can point at; it is drawn spread over the busy time in proportion, so
    the two parts add up to the busy bins and their totals to ``isolated_device_busy_s``
    and ``stretch_s``. A negative stretch (the work took less device time shared) draws
    none: every busy moment is the replays' work.

    Returns:
        (work, stretch) per bin, as fractions of the bin.
    """
    stretch_s = device_busy_s - isolated_device_busy_s
    share = stretch_s / device_busy_s if device_busy_s > 0 and stretch_s > 0 else 0.0
    return [b * (1.0 - share) for b in busy], [b * share for b in busy]


def device_idle(multi: PhaseTrace, isolated: Sequence[PhaseTrace]) -> dict[str, Any]:
    """The multi-tenant window taken apart against the bound's window.

    Returns:
        ``window_s``, ``device_busy_s`` and ``idle_s`` of the multi-tenant window;
        ``idle_by_cause_s``; ``isolated_device_busy_s`` (the bound's window when the
        device limits it); ``stretch_s`` = multi-tenant device-busy - isolated
        device-busy, per service in ``busy_by_service_s``; ``largest_part``, the
        biggest of stretch and the idle causes; and ``training_grouping`` per phase
        (:meth:`PhaseTrace.training_grouping`): a negative stretch is the shared run
        computing less for the same work, and its rows per step, CPU per row, kernel
        share and page faults per row say whether grouping or memory made it so.
    """
    by_cause = dict.fromkeys(IDLE_CAUSES, 0.0)
    busy = 0.0
    for start, end, cause in _segments(multi):
        if cause is None:
            busy += end - start
        else:
            by_cause[cause] += end - start
    iso_busy = sum(tr.device_busy_seconds() for tr in isolated)
    services = {
        s: {
            "multi_tenant": round(multi.busy_seconds(s), 2),
            "isolated": round(sum(tr.busy_seconds(s) for tr in isolated), 2),
        }
        for s in (*DEVICE_SERVICES, "environment")
    }
    parts = {"stretch": busy - iso_busy, **by_cause}
    return {
        "window_s": round(multi.window_s, 2),
        "device_busy_s": round(busy, 2),
        "idle_s": round(sum(by_cause.values()), 2),
        "idle_by_cause_s": {k: round(v, 2) for k, v in by_cause.items()},
        "isolated_device_busy_s": round(iso_busy, 2),
        "stretch_s": round(busy - iso_busy, 2),
        "busy_by_service_s": services,
        "largest_part": max(parts, key=lambda k: parts[k]),
        "training_grouping": {
            "multi_tenant": _rounded(multi.training_grouping()),
            **{tr.name: _rounded(tr.training_grouping()) for tr in isolated},
        },
    }


def _rounded(values: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else round(v, 3) for k, v in values.items()}
