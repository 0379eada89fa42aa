"""The evaluator (paper §4.2 "Evaluation path"): read-only runs against other tenants.

An evaluation declaration names trainable tenants as targets. Every ``interval_s`` (on
the injected clock) it runs one evaluation run per target: the Inference Model Service's
``evaluate`` resolves the target's serving version once (``pinned``) and runs
``episodes`` episodes in the evaluation tenant's own environment session through the
Inference Queue. No Training Queue partition, no optimizer, no version change; each
run records the one version it saw, its success rate and mean return, its seeds (a
spec's ``evaluation.seeds``: the same seeds give the same episodes) and, in LeRobot's
layout, ``eval/run_<k>/<target>/eval_info.json`` (:mod:`.eval_info`).

An evaluation with ``evaluation.tasks`` (e.g. ``["libero_spatial/*"]``, every task of a
LIBERO suite, as LIBERO results are reported) runs each run over those tasks: one
session per task, opened and closed by the run (``evaluation.sessions`` of them at
once, default one), the same episodes (or seeds) on each. The record has the per-task
success rates and the overall one, each with its Wilson 95 % interval (the overall rate
pools every episode); ``eval_info.json`` lists every task under ``per_task``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from joynexus.algorithms.intervals import wilson_interval
from joynexus.envs.base import EnvSpec
from joynexus.errors import ServiceUnavailableError, SpecError
from joynexus.services.rollout import EvalResult
from joynexus.workflows.context import WorkflowContext, WorkflowTenant, reason_of
from joynexus.workflows.eval_info import TaskEpisodes, eval_info_tasks, write_eval_info

__all__ = ["EvalRun", "TaskSuccess", "evaluation_tasks", "evaluator", "run_evaluation"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskSuccess:
    """One task's share of an evaluation run over several tasks."""

    task: str
    instruction: str
    version: int
    episodes: int
    successes: int
    mean_return: float

    def record(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "instruction": self.instruction,
            "version": self.version,
            "episodes": self.episodes,
            "successes": self.successes,
            "success_rate": self.successes / self.episodes,
            "success_ci95": list(wilson_interval(self.successes, self.episodes)),
            "mean_return": self.mean_return,
        }


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
    per_task: tuple[TaskSuccess, ...] = field(default=())


def evaluation_tasks(env: EnvSpec, tasks: list[str]) -> list[str]:
    """The tasks an evaluation over ``tasks`` runs (LIBERO's ``<suite>/*`` expanded).

    Raises:
        SpecError: a ``/*`` pattern for an env kind without suites, or an unknown suite.
    """
    out: list[str] = []
    for task in tasks:
        if task.endswith("/*"):
            if env.kind != "libero":
                raise SpecError(
                    f"evaluation task {task!r}: '<suite>/*' names a LIBERO suite, and the "
                    f"env kind is {env.kind!r}; list the tasks instead",
                    field="evaluation.tasks",
                )
            from joynexus.envs.libero import expand_suite_tasks

            out.extend(expand_suite_tasks(task))
        else:
            out.append(task)
    return out


def _segments(seeds: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of ``seeds`` as (first seed, count): one seeded evaluate each."""
    out: list[tuple[int, int]] = []
    for seed in seeds:
        if out and out[-1][0] + out[-1][1] == seed:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((seed, 1))
    return out


async def _evaluate_in(
    ctx: WorkflowContext, tenant: WorkflowTenant, target: str, session_id: str
) -> list[EvalResult]:
    ev = tenant.spec.evaluation
    assert ev is not None
    seeds = ev.seed_list()
    results: list[EvalResult] = []
    for first, count in _segments(seeds) if seeds is not None else [(None, ev.episodes)]:
        results.append(
            await ctx.inference.evaluate(
                target,
                session_id,
                episodes=count,
                deterministic=ev.deterministic,
                session_tenant=tenant.tenant_id,
                seed=first,
            )
        )
    return results


async def _evaluate_tasks(
    ctx: WorkflowContext, tenant: WorkflowTenant, target: str, tasks: list[str]
) -> list[tuple[str, str, list[EvalResult]]]:
    """(task, instruction, results) of each task, in order, each in a session of its own;
    ``evaluation.sessions`` of them at once."""
    env, ev = tenant.spec.env, tenant.spec.evaluation
    assert env is not None and ev is not None
    if ctx.env is None:
        raise ServiceUnavailableError(
            "an evaluation over several tasks opens sessions of its own, and this runtime "
            "gave the evaluator no Environment Service"
        )
    service = ctx.env
    # A LIBERO scene costs a simulator process of its own: at most ``sessions`` open.
    gate = asyncio.Semaphore(ev.sessions)

    async def one(task: str) -> tuple[str, str, list[EvalResult]]:
        async with gate:
            spec = env.model_copy(update={"task": task})
            info = await service.create_session(tenant.tenant_id, spec)
            try:
                results = await _evaluate_in(ctx, tenant, target, info.session_id)
            finally:
                await service.close(info.session_id, tenant_id=tenant.tenant_id)
            # A suite runs for many minutes: each task done is a line in the metrics and
            # progress to the Master's watchdog, which flags a silent workload stalled.
            tenant.metrics.write(
                "eval_task",
                target=target,
                task=task,
                episodes=sum(res.episodes for res in results),
                successes=sum(res.successes for res in results),
            )
            return task, info.schema.instruction, results

    return list(await asyncio.gather(*(one(task) for task in tasks)))


def _task_success(task: str, instruction: str, results: list[EvalResult]) -> TaskSuccess:
    episodes = sum(res.episodes for res in results)
    return TaskSuccess(
        task=task,
        instruction=instruction,
        version=int(results[0].version),
        episodes=episodes,
        successes=sum(res.successes for res in results),
        mean_return=sum(res.mean_return * res.episodes for res in results) / episodes,
    )


async def run_evaluation(
    ctx: WorkflowContext, tenant: WorkflowTenant, target: str, run: int
) -> EvalRun:
    """One read-only evaluation run of ``target`` in ``tenant``'s environment session
    (or, with ``evaluation.tasks``, in one session per task, in turn).

    With ``evaluation.seeds`` the run plays one episode per seed: consecutive seeds in
    one seeded call each, each call at one version (resolved when it starts; a list
    that is not one range may see a newer version between calls: ``versions_seen``
    records every version). Writes ``<output>/eval/run_<run>/<target>/eval_info.json``
    in LeRobot's layout when the tenant has an output directory.
    """
    ev, env = tenant.spec.evaluation, tenant.spec.env
    assert ev is not None and tenant.session_id is not None
    seeds = ev.seed_list()
    started = time.perf_counter()
    if ev.tasks is not None and env is not None:
        per = await _evaluate_tasks(ctx, tenant, target, evaluation_tasks(env, ev.tasks))
    else:
        task = (env.task or env.kind) if env is not None else "unknown"
        per = [(task, "", await _evaluate_in(ctx, tenant, target, tenant.session_id))]
    eval_s = time.perf_counter() - started
    results = [res for _, _, rs in per for res in rs]
    episodes = sum(res.episodes for res in results)
    wins = sum(res.successes for res in results)
    rows = tuple(_task_success(t, i, rs) for t, i, rs in per) if ev.tasks is not None else ()
    out = EvalRun(
        run=run,
        target=target,
        version=int(results[0].version),
        versions_seen=frozenset(int(v) for res in results for v in res.versions_seen),
        episodes=episodes,
        success_rate=wins / episodes,
        mean_return=sum(res.mean_return * res.episodes for res in results) / episodes,
        per_task=rows,
    )
    extra: dict[str, Any] = {"per_task": [r.record() for r in rows]} if rows else {}
    tenant.metrics.write(
        "eval",
        run=run,
        target=target,
        version=out.version,
        versions_seen=sorted(out.versions_seen),
        episodes=out.episodes,
        success_rate=out.success_rate,
        success_ci95=list(wilson_interval(wins, out.episodes)),
        mean_return=out.mean_return,
        seeds=seeds,
        **extra,
    )
    tasks = [
        TaskEpisodes(
            task=task,
            sum_rewards=[r for res in rs for r in res.episode_returns],
            max_rewards=[m for res in rs for m in res.episode_max_rewards],
            successes=[ok for res in rs for ok in res.episode_successes],
        )
        for task, _, rs in per
    ]
    complete = sum(len(t.sum_rewards) for t in tasks) == episodes
    if tenant.metrics.path is not None and env is not None and complete:
        info = eval_info_tasks(
            group=env.kind,
            tasks=tasks,
            seeds=seeds,
            eval_s=eval_s,
            extra={"target": target, "policy_version": out.version, "run": run},
        )
        where = tenant.metrics.path.parent / "eval" / f"run_{run}" / target / "eval_info.json"
        write_eval_info(where, info)
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
