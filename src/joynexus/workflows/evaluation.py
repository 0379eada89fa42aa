"""The evaluator (paper §4.2 "Evaluation path"): read-only runs against other tenants.

An evaluation declaration names trainable tenants as targets. Every ``interval_s`` (on
the injected clock) it runs one evaluation run per target: the Inference Model Service's
``evaluate`` resolves the target's serving version once (``pinned``) and runs
``episodes`` episodes in the evaluation tenant's own environment session through the
Inference Queue. No Training Queue partition, no optimizer, no version change; each
run records the one version it saw, its success rate and mean return.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from joynexus.algorithms.intervals import wilson_interval
from joynexus.workflows.context import WorkflowContext, WorkflowTenant, reason_of

__all__ = ["EvalRun", "evaluator", "run_evaluation"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalRun:
    """One evaluation run of one target."""

    run: int
    target: str
    version: int
    versions_seen: frozenset[int]
    episodes: int
    success_rate: float
    mean_return: float


async def run_evaluation(
    ctx: WorkflowContext, tenant: WorkflowTenant, target: str, run: int
) -> EvalRun:
    """One read-only evaluation run of ``target`` in ``tenant``'s environment session."""
    ev = tenant.spec.evaluation
    assert ev is not None and tenant.session_id is not None
    result = await ctx.inference.evaluate(
        target,
        tenant.session_id,
        episodes=ev.episodes,
        deterministic=ev.deterministic,
        session_tenant=tenant.tenant_id,
    )
    out = EvalRun(
        run=run,
        target=target,
        version=int(result.version),
        versions_seen=frozenset(int(v) for v in result.versions_seen),
        episodes=int(result.episodes),
        success_rate=float(result.success_rate),
        mean_return=float(result.mean_return),
    )
    tenant.metrics.write(
        "eval",
        run=run,
        target=target,
        version=out.version,
        versions_seen=sorted(out.versions_seen),
        episodes=out.episodes,
        success_rate=out.success_rate,
        success_ci95=list(wilson_interval(result.successes, out.episodes)),
        mean_return=out.mean_return,
    )
    return out


async def evaluator(ctx: WorkflowContext, tenant: WorkflowTenant) -> list[EvalRun]:
    """Run ``evaluation.runs`` runs over every target, ``interval_s`` apart; return them.

    The first run starts after one interval so that it overlaps with training.
    """
    ev = tenant.spec.evaluation
    assert ev is not None
    runs: list[EvalRun] = []
    for k in range(tenant.eval_first_run, ev.runs):  # a resumed evaluation skips done runs
        await ctx.clock.sleep(ev.interval_s)
        for target in ev.targets:
            try:
                runs.append(await run_evaluation(ctx, tenant, target, k))
            except Exception as error:  # a failed run is recorded; later runs still happen
                log.warning("evaluation %s of %s failed: %s", k, target, error)
                tenant.errors.append(reason_of(error))
    return runs
