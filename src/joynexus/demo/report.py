"""The demo's report: Table 1 and Figure 9 of §5.1 on measured traces, and report.json
(its figures: :mod:`joynexus.demo.plots`).

Definitions (all from the traces of :mod:`joynexus.demo.phase`):

* **Window** of a phase: from the moment the first workload's loops start to the
  completion of its last matched update (model loading, the first session's start-up
  and final checkpoints are outside; they are reported in ``wall_s``; the Master
  launches a phase's workloads concurrently, so later sessions may start inside it).
* **Utilization** of a service = its busy seconds inside the window ÷ the window. Busy
  seconds are the measured durations of grouped inference batches and of training
  (optimizer / actor-forward) steps — what the plane's usage meter accumulates.
  The isolated row is the mean over the standalone RL replays, as in Table 1; the
  aggregate over all replays (SFT included) is reported too.
* **Device time**: both phases ran on the same single machine, every service sharing
  it, so a phase's device time is its window × 1 machine, less the window's
  **interference**: the seconds the device's work was ready to run but its core ran
  another thread or process (the device thread's run-queue wait inside its steps and
  batches, :mod:`joynexus.utils.device_clock`; where the kernel does not keep it, wall
  busy − the thread's CPU seconds). ``device_time_ratio`` = Σ isolated device time ÷
  multi-tenant device time (same matched work): what the phases needed had their
  device work run whenever it was ready, so other load on the machine (which stretches
  a device-bound multi-tenant window far more than mostly-waiting replays) does not
  decide it. The plain wall-clock ratio (Σ isolated windows ÷ multi-tenant window) is
  ``device_time.wall``; the interference of every phase, split into run-queue wait and
  the rest of wall busy − CPU busy (blocked: the GIL, I/O), is in each phase's
  ``device`` and the machine's load over each phase (1-minute load average min / mean
  / max, each core's busy seconds) in ``machine.phases``. The paper's accounting
  (multi-tenant 2-2-4 = 8 devices, isolated 1-1-2 = 4 devices) is reported as
  ``device_time_ratio_layout_weighted``; here it is arithmetic on the measured windows,
  not a measurement on 8 devices.

* **Success rate** of a trainable tenant (``report.json``'s ``success_rates``, per
  tenant, and the ``tenant_row`` of its isolated replay): episodes succeeded ÷
  ``eval_episodes`` in its own simulator on fixed evaluation seeds (``eval_first_seed``
  + j, never the demonstration seeds), measured by the Master before the tenant's first
  update and after its last, each with its Wilson 95 % interval
  (``success_rate_ci95_initial`` / ``_final``). It is measured in the isolated replays,
  where the tenant trains alone on its matched updates and both measurements fall
  outside the replay's window (before its loops start, after its last matched update):
  they lengthen the replays' wall time, not their windows. The multi-tenant run
  measures none: there a tenant's "before" would delay its start while the others
  train, and an early "after" would overlap their work, changing what is compared.
  ``joynexus demo --success-episodes 0`` leaves the measurements out.

Which way is good (``report.json``'s ``how_to_read``, the tables' captions and the
verdict line say it too): a ``device_time_ratio`` above 1 means the isolated replays
needed more device time than the multi-tenant run for the same work, so sharing saved
device time; below 1, sharing cost time.

Utilization is given as the two utilizations side by side (``utilization``), with a
ratio multi-tenant / isolated only where the isolated service was mostly busy: the
isolated RL replays' services mostly wait for their simulators, and a ratio over that
waiting would read as a large "improvement" that sharing did not make
(:func:`joynexus.demo.readout.utilization_reading`).

``report.json`` leads with ``headline`` — the device-time verdict (ratio, bound,
efficiency), each tenant's success before → after, the utilization readings — in the
order ``joynexus demo`` prints them (:func:`joynexus.demo.readout.print_report`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from joynexus.demo.idle import device_idle
from joynexus.demo.phase import PhaseTrace, span_fraction
from joynexus.demo.readout import (
    format_success,
    interference_line,
    load_line,
    success_reading,
    utilization_reading,
    verdict,
)

__all__ = [
    "HOW_TO_READ",
    "LAYOUT_DEVICES_ISOLATED",
    "LAYOUT_DEVICES_MULTI",
    "build_report",
    "device_time_bound",
    "headline",
    "loss_curve",
    "return_curve",
    "write_report",
]

LAYOUT_DEVICES_MULTI = 8  # 2-2-4
LAYOUT_DEVICES_ISOLATED = 4  # 1-1-2
SERVICES = ("training", "inference", "environment")

#: Which way each ratio of the report is good (also written to ``report.json``).
HOW_TO_READ = {
    "device_time_ratio": (
        "isolated / multi-tenant device time for the same matched work: above 1 means "
        "the multi-tenant run needed less device time (sharing saved time; higher is "
        "better), below 1 that it needed more. A phase's device time is its window less "
        "its interference (seconds the device's work was ready but its core ran another "
        "thread or process), so the machine's other load does not decide the ratio; the "
        "plain wall-clock ratio is device_time.wall"
    ),
    "interference": (
        "per phase: device_spans_wall_s (the wall seconds of the device work, lock "
        "waits included) = device_cpu_s (the device thread's own CPU) + "
        "run_queue_wait_s (ready, but its core ran something else: other processes, "
        "or this process's host threads) + "
        "blocked_s (the backbone lock, the GIL, I/O: the system's own waits, kept in "
        "the device time); device_wall_busy_s is the steps' and batches' measured wall "
        "seconds (the busy intervals, lock waits excluded); simulator_wait_s is the "
        "simulator workers' run-queue wait during their calls and "
        "simulator_interference_s the part of it the device waited out (at most the "
        "seconds a simulator call ran while the device was idle); interference_s = "
        "run_queue_wait_s + simulator_interference_s, at most window_s less the device "
        "threads' CPU seconds over the device's cores (waits are summed per thread, so "
        "two threads waiting at once would count one lost second twice)"
    ),
    "device_time_ratio_layout_weighted": (
        "the same ratio with the paper's device counts (1-1-2 isolated, 2-2-4 "
        "multi-tenant): above 1 is better for multi-tenancy"
    ),
    "device_time_bound": (
        "the largest device_time_ratio the isolated replays allow on this machine: their "
        "summed device times / the larger of their summed device-busy (the device "
        "thread's CPU seconds) and simulator-busy seconds (a perfect overlap of all "
        "replays still needs the busiest resource's time); efficiency = (ratio - 1) / "
        "(bound - 1): 1 reaches the bound, 0 is no gain, below 0 is a loss"
    ),
    "device_idle": (
        "the multi-tenant window taken apart: device-busy seconds + idle seconds by "
        "cause; window - isolated_device_busy_s (the bound's window when the device "
        "limits it) = stretch_s (the same work kept the device busy longer than in the "
        "replays: contention) + idle_s (see device_idle.png and joynexus.demo.idle); "
        "training_grouping gives each phase's training steps, rows per step, the "
        "device's CPU ms per row, the kernel's share of that CPU and the pages first "
        "touched per row: whether a phase computed the same work at another cost per row "
        "(a negative stretch), and whether that was grouping or memory"
    ),
    "utilization": (
        "busy seconds / window of a shared service, multi-tenant and isolated side by "
        "side; ratio = multi-tenant / isolated only where the isolated service was mostly "
        "busy (otherwise null: the isolated RL replays mostly wait for their simulators, "
        "and a ratio would measure that waiting, not a gain from sharing)"
    ),
    "success_rate": (
        "episodes succeeded / eval_episodes on fixed evaluation seeds, before the "
        "tenant's first update (initial) and after its last (final), in its isolated "
        "replay of the matched work; higher is better. [low, high] is the Wilson 95 % "
        "interval: a change whose intervals overlap is not told apart by this many "
        "episodes"
    ),
}


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def loss_curve(records: Sequence[dict[str, Any]]) -> list[float]:
    return [float(r["loss"]) for r in records if r["kind"] == "train" and r.get("loss") is not None]


def return_curve(records: Sequence[dict[str, Any]]) -> list[float]:
    return [
        float(r["mean_return"])
        for r in records
        if r["kind"] == "rollout" and r.get("mean_return") is not None
    ]


def _tenant_row(trace: PhaseTrace, tenant: str) -> dict[str, Any]:
    recs = trace.records.get(tenant, [])
    losses, rets = loss_curve(recs), return_curve(recs)
    done = trace.completed(tenant)
    summ = trace.summary.tenants.get(tenant)
    n = trace.matched.get(tenant, 0)
    finish = done[n - 1].finished_at if 0 < n <= len(done) else None
    return {
        "task": summ.task if summ else None,
        "updates_matched": n,
        "updates_in_window": trace.updates_in_window(tenant),
        "jobs_completed": summ.jobs_completed if summ else 0,
        "jobs_dropped": summ.jobs_dropped if summ else 0,
        "final_version": summ.final_version if summ else None,
        "loss_first": _r(losses[0]) if losses else None,
        "loss_last": _r(losses[-1]) if losses else None,
        "return_first": _r(rets[0]) if rets else None,
        "return_last": _r(rets[-1]) if rets else None,
        "time_to_matched_s": _r(finish - trace.started_at, 2) if finish else None,
        "usage_device_seconds": {
            k: _r(v) for k, v in trace.usage.tenants[tenant].device_seconds.items()
        }
        if tenant in trace.usage.tenants
        else {},
    }


def _ci(ci: tuple[float, float] | None) -> list[float] | None:
    return None if ci is None else [round(ci[0], 4), round(ci[1], 4)]


_SUCCESS_KEYS = (
    "success_rate_initial",
    "success_rate_final",
    "success_rate_ci95_initial",
    "success_rate_ci95_final",
    "eval_episodes",
    "eval_first_seed",
    "success_errors",
)


def _success_row(trace: PhaseTrace, tenant: str) -> dict[str, Any]:
    """The tenant's success rate before and after training, from the run summary
    (all None when it was not measured); a failed measurement is in ``success_errors``."""
    summ = trace.summary.tenants.get(tenant)
    if summ is None:
        return {
            "success_rate_initial": None,
            "success_rate_final": None,
            "success_rate_ci95_initial": None,
            "success_rate_ci95_final": None,
            "eval_episodes": None,
            "eval_first_seed": None,
            "success_errors": [],
        }
    return {
        "success_rate_initial": _r(summ.success_rate_initial),
        "success_rate_final": _r(summ.success_rate_final),
        "success_rate_ci95_initial": _ci(summ.success_rate_ci95_initial),
        "success_rate_ci95_final": _ci(summ.success_rate_ci95),
        "eval_episodes": summ.eval_episodes,
        "eval_first_seed": summ.eval_first_seed,
        "success_errors": [e for e in summ.errors if e.startswith("success_eval")],
    }


def _device(trace: PhaseTrace) -> dict[str, Any]:
    """Where the phase's device busy time went: own CPU, run-queue wait, the rest."""
    cpu, wait = trace.device_cpu_seconds(), trace.device_wait_seconds()
    sim_wait = trace.simulator_wait_seconds()
    lo, hi = trace.started_at, trace.ended_at
    spans_wall = sum(max(min(sp.end, hi) - max(sp.start, lo), 0.0) for sp in trace.device_spans)
    measured = bool(trace.device_spans)
    return {
        "device_time_s": _r(trace.own_window_s, 3),
        "interference_s": _r(trace.interference_seconds(), 3),
        "device_wall_busy_s": _r(trace.device_busy_seconds(), 3),
        "device_spans_wall_s": _r(spans_wall, 3) if measured else None,
        "device_cpu_s": _r(cpu, 3) if measured else None,
        "run_queue_wait_s": _r(wait, 3) if measured else None,
        "blocked_s": _r(spans_wall - cpu - (wait or 0.0), 3) if measured else None,
        "simulator_wait_s": _r(sim_wait, 3) if sim_wait is not None else None,
        "simulator_interference_s": _r(trace.simulator_interference_seconds(), 3),
        "device_spans": len(trace.device_spans),
    }


def _phase_load(trace: PhaseTrace) -> dict[str, Any]:
    """The machine's load over the phase, with what its device cores ran besides the
    device's own work (other threads of this process and other processes)."""
    m = trace.machine
    out = m.to_json()
    span_wait = sum(
        (sp.wait_s or 0.0) * span_fraction(sp, m.start, m.end) for sp in trace.device_spans
    )
    if m.process_wait_s is not None:
        # The process's threads less the device's: what its host threads waited for a core.
        out["process"]["host_run_queue_wait_s"] = _r(max(m.process_wait_s - span_wait, 0.0), 2)
    cores = trace.device_cores
    if cores and m.core_busy_s and all(c in m.core_busy_s for c in cores):
        own = sum(sp.cpu_s * span_fraction(sp, m.start, m.end) for sp in trace.device_spans)
        busy = sum(m.core_busy_s[c] for c in cores)
        out["device_cores"] = cores
        out["device_cores_busy_s"] = _r(busy, 2)
        out["device_cores_other_s"] = _r(busy - own, 2)
    return out


def _phase(trace: PhaseTrace) -> dict[str, Any]:
    return {
        "name": trace.name,
        "window_s": _r(trace.window_s, 3),
        "device": _device(trace),
        "wall_s": _r(trace.wall_s, 2),
        "training_utilization": _r(trace.utilization("training")),
        "inference_utilization": _r(trace.utilization("inference")),
        "environment_busy_s": _r(trace.busy_seconds("environment"), 2),
        "busy_seconds": {s: _r(trace.busy_seconds(s), 3) for s in SERVICES},
        "usage_service_seconds": {k: _r(v, 3) for k, v in trace.usage.service_seconds.items()},
        "inference_lock_wait": _lock_wait(trace),
    }


def _lock_wait(trace: PhaseTrace) -> dict[str, Any]:
    """What sharing the backbone with training cost inference in this phase: the time
    its batches waited for the backbone lock, per batch and against their device time."""
    wait_s, batches = trace.predict_stages.get("lock_wait", (0.0, 0))
    device_s = sum(trace.predict_stages.get(s, (0.0, 0))[0] for s in _DEVICE_STAGES)
    return {
        "batches": batches,
        "wait_s": _r(wait_s, 3),
        "ms_per_batch": _r(wait_s / batches * 1e3, 2) if batches else None,
        "fraction_of_device_s": _r(wait_s / device_s) if device_s > 0 else None,
    }


_DEVICE_STAGES = ("canonicalize", "backbone", "head")


def build_report(
    multi: PhaseTrace,
    isolated: Sequence[PhaseTrace],
    *,
    profile: str,
    reason: str,
    knobs: dict[str, Any],
    rl_tenants: Sequence[str],
    sft_tenant: str,
    eval_tenant: str,
) -> dict[str, Any]:
    """The report document (``report.json``); see the module docstring for definitions."""
    mt = _phase(multi)
    mt["tenants"] = {t: _tenant_row(multi, t) for t in (*rl_tenants, sft_tenant)}
    ev = multi.summary.tenants.get(eval_tenant)
    mt["evaluation"] = {
        "tenant": eval_tenant,
        "success_rate": ev.eval_success_rate if ev else None,
        "runs": [r.model_dump() for r in ev.eval_runs] if ev else [],
    }
    replays = []
    for tr in isolated:
        row = _phase(tr)
        tenant = next(iter(tr.matched))
        row["tenant"] = tenant
        row["tenant_row"] = _tenant_row(tr, tenant) | _success_row(tr, tenant)
        replays.append(row)
    rl_replays = [tr for tr in isolated if next(iter(tr.matched)) in rl_tenants]

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    iso_window = sum(tr.window_s for tr in isolated)
    iso_own = sum(tr.own_window_s for tr in isolated)
    iso = {
        "training_utilization": _r(mean([tr.utilization("training") for tr in rl_replays])),
        "inference_utilization": _r(mean([tr.utilization("inference") for tr in rl_replays])),
        "aggregate_training_utilization": _r(
            sum(tr.busy_seconds("training") for tr in isolated) / max(iso_window, 1e-9)
        ),
        "aggregate_inference_utilization": _r(
            sum(tr.busy_seconds("inference") for tr in isolated) / max(iso_window, 1e-9)
        ),
        "window_s": _r(iso_window, 3),
        "wall_s": _r(sum(tr.wall_s for tr in isolated), 2),
        "replays": replays,
    }
    ratio = iso_own / multi.own_window_s
    bound = device_time_bound(isolated, ratio)
    wall_ratio = iso_window / multi.window_s
    layout = (iso_own * LAYOUT_DEVICES_ISOLATED) / (multi.own_window_s * LAYOUT_DEVICES_MULTI)
    spans = multi.device_spans or any(tr.device_spans for tr in isolated)

    report: dict[str, Any] = {
        "device_time_ratio": _r(ratio, 3),
        "device_time_bound": bound,
        "device_time": {
            "definition": (
                "(window - interference) x devices; both phases ran on the same single "
                "machine, so device time = (window - interference) seconds x 1, where "
                "interference = the device thread's run-queue wait inside its steps and "
                "batches (ready to run, its core running something else) plus the "
                "simulators' run-queue wait while the device was idle waiting for them"
            ),
            "basis": (
                "device thread's CPU time and run-queue wait"
                if spans
                else "wall clock (no device span recorded)"
            ),
            "multi_tenant_s": _r(multi.own_window_s, 2),
            "isolated_s": _r(iso_own, 2),
            "interference": {
                "multi_tenant_s": _r(multi.interference_seconds(), 2),
                "isolated_s": _r(sum(tr.interference_seconds() for tr in isolated), 2),
            },
            "wall": {
                "definition": "window seconds x 1 machine, interference included",
                "ratio": _r(wall_ratio, 3),
                "bound": device_time_bound(isolated, wall_ratio, basis="wall"),
                "multi_tenant_s": _r(multi.window_s, 2),
                "isolated_s": _r(iso_window, 2),
            },
            "layout_weighted": {
                "definition": (
                    "paper accounting, arithmetic on the measured device times: "
                    f"multi-tenant x {LAYOUT_DEVICES_MULTI} devices (2-2-4), isolated x "
                    f"{LAYOUT_DEVICES_ISOLATED} (1-1-2)"
                ),
                "multi_tenant_device_s": _r(multi.own_window_s * LAYOUT_DEVICES_MULTI, 2),
                "isolated_device_s": _r(iso_own * LAYOUT_DEVICES_ISOLATED, 2),
            },
        },
        "device_time_ratio_layout_weighted": _r(layout, 3),
        "device_idle": device_idle(multi, isolated),
        "success_rates": {
            "measured_in": "isolated replays (each tenant alone, its matched updates)",
            "tenants": {
                r["tenant"]: {
                    "task": r["tenant_row"]["task"],
                    "updates": r["tenant_row"]["updates_matched"],
                }
                | {k: v for k, v in r["tenant_row"].items() if k in _SUCCESS_KEYS}
                | {"reading": success_reading(r["tenant_row"])}
                for r in replays
            },
        },
        "utilization": _utilization(mt, iso, rl_replays),
        "profile": profile,
        "env_choice_reason": reason,
        "knobs": knobs,
        "machine": _machine() | {"phases": {tr.name: _phase_load(tr) for tr in (multi, *isolated)}},
        "matched_updates": dict(multi.matched),
        "multi_tenant": mt,
        "isolated": iso,
        "how_to_read": dict(HOW_TO_READ),
    }
    return {"headline": headline(report), **report}


def _utilization(
    mt: dict[str, Any], iso: dict[str, Any], rl_replays: Sequence[PhaseTrace]
) -> dict[str, Any]:
    """Each shared service's utilization, multi-tenant and isolated side by side, with a
    ratio only where it means a gain (see ``HOW_TO_READ["utilization"]``)."""
    windows = sum(tr.window_s for tr in rl_replays)
    sims = sum(tr.busy_seconds("environment") for tr in rl_replays) / windows if windows else None
    services = {}
    for service in ("training", "inference"):
        key = f"{service}_utilization"
        ratio, reading = utilization_reading(service, mt[key], iso[key], sims)
        services[service] = {
            "multi_tenant": mt[key],
            "isolated_rl_mean": iso[key],
            "isolated_aggregate": iso[f"aggregate_{key}"],
            "ratio": _r(ratio, 3),
            "reading": reading,
        }
    return {"isolated_rl_simulator_share": _r(sims), "services": services}


def _machine() -> dict[str, Any]:
    """The machine, and how loaded it was as the report was written (a shared machine
    stretches both phases, unevenly: read the ratio with the load beside it)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpu_cores": os.cpu_count(),
        "devices": "one CPU machine, shared by all",
        "load_average_1_5_15_min_at_end": None if load is None else [round(x, 2) for x in load],
    }


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """What the demo shows, in reading order: the device-time verdict (ratio, bound,
    efficiency), each trainable tenant's success before → after, the utilizations."""
    tenants = (report.get("success_rates") or {}).get("tenants", {})
    services = (report.get("utilization") or {}).get("services", {})
    return {
        "device_time": verdict(report),
        "interference": interference_line(report),
        "machine_load": load_line(report),
        "learning": {
            t: f"{format_success(row)}: {row.get('reading', success_reading(row))}"
            for t, row in tenants.items()
        },
        "utilization": [row["reading"] for row in services.values()],
    }


def device_time_bound(
    isolated: Sequence[PhaseTrace], ratio: float, *, basis: str = "own"
) -> dict[str, Any]:
    """The largest device-time ratio the isolated replays allow, and how much of the
    possible gain ``ratio`` achieved (see ``HOW_TO_READ["device_time_bound"]``).

    Overlapping every replay perfectly still leaves the busiest resource's seconds: the
    shared device's (training and inference steps) or the simulators' (their steps).

    Args:
        basis: ``own`` — device times less interference, the device's own CPU busy
            seconds and the simulators' calls less their run-queue wait (what
            ``device_time_ratio`` is measured on); ``wall`` — windows and wall busy
            seconds.
    """
    simulator_s = sum(tr.busy_seconds("environment") for tr in isolated)
    if basis == "wall":
        windows = sum(tr.window_s for tr in isolated)
        device_s = sum(tr.device_busy_seconds() for tr in isolated)
    else:
        windows = sum(tr.own_window_s for tr in isolated)
        device_s = sum(tr.device_own_busy_seconds() for tr in isolated)
        # The simulators on their own clock too: their calls less their run-queue wait.
        simulator_s -= sum(tr.simulator_wait_seconds() or 0.0 for tr in isolated)
    floor = max(device_s, simulator_s)
    limited_by = "device" if device_s >= simulator_s else "simulators"
    bound = windows / floor if floor > 0 else None
    efficiency = (ratio - 1.0) / (bound - 1.0) if bound is not None and bound > 1.0 + 1e-9 else None
    return {
        "bound": _r(bound, 3),
        "efficiency": _r(efficiency, 3),
        "isolated_window_s": _r(windows, 2),
        "isolated_device_busy_s": _r(device_s, 2),
        "isolated_simulator_busy_s": _r(simulator_s, 2),
        "limited_by": limited_by if floor > 0 else None,
    }


def write_report(report: dict[str, Any], out_dir: Path) -> Path:
    """Write ``report.json`` (2-space indent, keys in the report's reading order)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    # In the report's own order (it leads with ``headline``), not sorted by key.
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path
