"""The §5.1 experiment: a multi-tenant run and its workload-matched isolated replay.

1. **Multi-tenant.** Every tenant of the expanded scenario runs at once on the shared
   layout for ``window_s``. The *matched work* is the RL updates whose actor phase
   begins inside the window (per tenant) plus the SFT jobs started inside it; the
   makespan ends at the completion of the last matched update.
2. **Isolated.** Each RL tenant runs alone on the isolated layout with the same loop
   code and a completion target equal to its matched count; then each SFT tenant's
   matched work runs alone on the isolated layout. The traces run one after another,
   so their GPU time is ``isolated GPUs × Σ durations``.

``device_time_ratio`` = isolated GPU time ÷ multi-tenant GPU time for the same work.
Table 1's isolated row is the mean over the standalone RL traces, as in the paper.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from joynexus.sim.model import RunResult, Simulation, timeline
from joynexus.sim.scenario import (
    PAPER_REFERENCE,
    Scenario,
    expand,
    isolated_rl,
    isolated_sft,
)

Progress = Callable[[str], None]

#: Bin width of the utilization timelines in the JSON report.
TIMELINE_BIN_S = 60.0


@dataclass(slots=True)
class Trace:
    """One isolated replay."""

    tenant_id: str
    kind: str  # "rl" or "sft"
    updates: int
    duration_s: float
    result: RunResult | None  # None when the tenant had no matched work

    def training_utilization(self) -> float:
        return 0.0 if self.result is None else self.result.training_utilization(self.duration_s)

    def inference_utilization(self) -> float:
        return 0.0 if self.result is None else self.result.inference_utilization(self.duration_s)


@dataclass(slots=True)
class Experiment:
    """Both runs of one scenario, with everything the report needs."""

    scenario: Scenario
    multi: RunResult
    makespan_s: float
    matched: dict[str, int]
    traces: list[Trace]
    multi_gpus: int
    isolated_gpus: int
    runtime_s: float


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def run_experiment(scenario: Scenario, progress: Progress | None = None) -> Experiment:
    """Run the multi-tenant trace, then the matched isolated replays."""
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    dep = expand(scenario)
    say(f"multi-tenant run: {len(dep.rl)} RL + {len(dep.sft)} SFT tenants")
    window = scenario.window_s
    multi = Simulation(scenario, dep, window_s=window, time_limit_s=window * 50).run()
    matched_updates = [u for u in multi.updates if u.leased_at < window]
    makespan = max((u.finished_at for u in matched_updates), default=0.0)
    matched = {s.tenant.tenant_id: 0 for s in dep.rl} | {s.tenant.tenant_id: 0 for s in dep.sft}
    for u in matched_updates:
        matched[u.tenant_id] += 1
    traces: list[Trace] = []
    limit = max(window, makespan) * 50
    for spec in dep.rl:
        tid = spec.tenant.tenant_id
        say(f"isolated replay: {tid} ({matched[tid]} updates)")
        traces.append(_replay(scenario, isolated_rl(scenario, spec), tid, "rl", matched, limit))
    for sft in dep.sft:
        tid = sft.tenant.tenant_id
        say(f"isolated replay: {tid} ({matched[tid]} SFT jobs)")
        traces.append(_replay(scenario, isolated_sft(scenario, sft), tid, "sft", matched, limit))
    return Experiment(
        scenario=scenario,
        multi=multi,
        makespan_s=makespan,
        matched=matched,
        traces=traces,
        multi_gpus=dep.total_gpus,
        isolated_gpus=scenario.isolated.total_gpus,
        runtime_s=time.perf_counter() - t0,
    )


def _replay(
    scenario: Scenario,
    dep: Any,
    tid: str,
    kind: str,
    matched: dict[str, int],
    limit: float,
) -> Trace:
    n = matched[tid]
    if n == 0:
        return Trace(tid, kind, 0, 0.0, None)
    res = Simulation(scenario, dep, completion_targets={tid: n}, time_limit_s=limit).run()
    return Trace(tid, kind, n, res.end_time, res)


def summarize(exp: Experiment) -> dict[str, Any]:
    """The JSON report (keys documented in docs and asserted by tests)."""
    multi, makespan = exp.multi, exp.makespan_s
    rl_traces = [t for t in exp.traces if t.kind == "rl" and t.result is not None]
    iso_train = _mean([t.training_utilization() for t in rl_traces])
    iso_inf = _mean([t.inference_utilization() for t in rl_traces])
    mt_train = multi.training_utilization(makespan)
    mt_inf = multi.inference_utilization(makespan)
    multi_gpu_time = exp.multi_gpus * makespan
    iso_gpu_time = exp.isolated_gpus * sum(t.duration_s for t in exp.traces)
    window = exp.scenario.window_s
    drops_by_tenant: dict[str, int] = {}
    for d in multi.drops:
        drops_by_tenant[d.tenant_id] = drops_by_tenant.get(d.tenant_id, 0) + 1
    last_finish: dict[str, float] = {}
    samples: dict[str, int] = {}
    for u in multi.updates:
        if u.leased_at < window:
            last_finish[u.tenant_id] = max(last_finish.get(u.tenant_id, 0.0), u.finished_at)
            samples[u.tenant_id] = samples.get(u.tenant_id, 0) + u.sample_count
    tenants = [
        {
            "tenant_id": t.tenant_id,
            "kind": t.kind,
            "matched_updates": t.updates,
            "matched_samples": samples.get(t.tenant_id, 0),
            "multi_tenant_last_update_s": last_finish.get(t.tenant_id, 0.0),
            "isolated_duration_s": t.duration_s,
            "isolated_training_utilization": t.training_utilization(),
            "isolated_inference_utilization": t.inference_utilization(),
            "multi_tenant_rollouts": multi.rollouts.get(t.tenant_id, 0),
            "multi_tenant_drops": drops_by_tenant.get(t.tenant_id, 0),
            "isolated_drops": 0 if t.result is None else len(t.result.drops),
            "final_policy_version": multi.final_versions.get(t.tenant_id, 0),
        }
        for t in exp.traces
    ]
    batches = multi.inference_batches
    return {
        "scenario": exp.scenario.model_dump(mode="json"),
        "multi_tenant": {
            "training_utilization": mt_train,
            "inference_utilization": mt_inf,
            "makespan_s": makespan,
            "gpus": exp.multi_gpus,
            "gpu_time_s": multi_gpu_time,
            "matched_updates": sum(exp.matched.values()),
            "drops": len(multi.drops),
            "inference_batches": batches,
            "mean_inference_batch_samples": multi.inference_samples / batches if batches else 0.0,
            "max_active_rollouts": multi.max_active_rollouts,
            "max_active_rollouts_per_tenant": max(
                multi.max_active_rollouts_per_tenant.values(), default=0
            ),
            "refusals": multi.refusals,
            "events": multi.events,
        },
        "isolated": {
            "training_utilization": iso_train,
            "inference_utilization": iso_inf,
            "gpus_per_trace": exp.isolated_gpus,
            "gpu_time_s": iso_gpu_time,
            "total_duration_s": sum(t.duration_s for t in exp.traces),
            "rl_gpu_time_s": exp.isolated_gpus
            * sum(t.duration_s for t in exp.traces if t.kind == "rl"),
            "sft_gpu_time_s": exp.isolated_gpus
            * sum(t.duration_s for t in exp.traces if t.kind == "sft"),
            "rl_traces": len(rl_traces),
        },
        "device_time_ratio": iso_gpu_time / multi_gpu_time if multi_gpu_time else 0.0,
        "device_time_reduction": 1.0 - multi_gpu_time / iso_gpu_time if iso_gpu_time else 0.0,
        "relative_improvement": {
            "training": mt_train / iso_train if iso_train else 0.0,
            "inference": mt_inf / iso_inf if iso_inf else 0.0,
        },
        "tenants": tenants,
        "timeline": {
            "bin_s": TIMELINE_BIN_S,
            "multi_tenant": {
                "training": timeline(list(multi.actor_busy.values()), makespan, TIMELINE_BIN_S),
                "inference": timeline(multi.inference_busy, makespan, TIMELINE_BIN_S),
            },
        },
        "paper_reference": dict(PAPER_REFERENCE),
        "runtime_s": exp.runtime_s,
    }
