"""RL preprocessing stages (paper Appendix A.5): actor-forward and advantages.

Both lease control metadata only; the samples stay in the rollout's partition and the
derived fields are written back against the same samples with ``put``:

* **actor-forward** (optional, per algorithm): ``lease_stage(reserved →
  computing_actor_forward)`` of jobs a producer handed off, recompute log-probs and
  values of the behaviour actions under the resident actor
  (``TrainingModelService.actor_forward`` puts ``actor_log_probs`` / ``actor_values``),
  then ``mark(needs_advantages)``.
* **advantages**: ``lease_stage(needs_advantages → computing_advantages)``, read the
  rollout with ``get_meta`` / ``get_data``, reshape the flattened samples (sample
  ``k = t · num_envs + n``) to time-major ``[T, N]`` by their ``t`` and ``env`` fields,
  compute GAE (ppo), group-normalised returns (grpo) or discounted returns
  (reinforce), ``put`` ``advantages`` / ``returns``, and ``mark(ready)``. GRPO's groups
  come with the rollout: a grouped rollout (``algorithm.group_size``) stores each
  sample's ``group`` (its env's group of sub-envs that started from one initial state).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np

from joynexus.algorithms.advantages import discounted_returns, gae, grpo
from joynexus.control.job import JobState, TrainingJob
from joynexus.errors import InvalidRequestError
from joynexus.queues.meta import BatchMeta
from joynexus.services.samples import GROUP, as_numpy
from joynexus.spec.workload import AlgorithmSpec
from joynexus.workflows.actor import fail_job
from joynexus.workflows.context import ACTOR_ROLE, WorkflowContext
from joynexus.workflows.storage import FailedIteration, fail_until_stored, failure_reason

__all__ = [
    "ADVANTAGE_TASK",
    "actor_forward_once",
    "actor_forward_stage",
    "advantage_once",
    "advantage_stage",
    "compute_advantages",
]

ADVANTAGE_TASK = "compute_advantages_and_returns"
_READ_CHUNK = 4096


def _time_major(
    values: np.ndarray, t: np.ndarray, env: np.ndarray, shape: tuple[int, int]
) -> np.ndarray:
    out = np.zeros(shape, dtype=values.dtype)
    out[t, env] = values
    return out


def compute_advantages(
    samples: Mapping[str, np.ndarray], algorithm: AlgorithmSpec
) -> dict[str, np.ndarray]:
    """Advantages and returns of flattened rollout samples, in the samples' order.

    Args:
        samples: ``rewards``, ``dones``, ``t``, ``env`` and, for ppo, ``values`` (or
            ``actor_values`` when the actor-forward stage ran) and ``bootstrap_values``;
            one row per sample.
        algorithm: ``ppo`` → GAE(γ, λ); ``grpo`` → group-normalised episode returns,
            grouped by the samples' ``group`` field and episode ordinal when the rollout
            was grouped (``algorithm.group_size``), else all episodes of the job in one
            group; ``reinforce`` → discounted returns, advantages centred on their mean.

    Raises:
        InvalidRequestError: the ``(t, env)`` pairs do not tile a ``[T, N]`` grid, or a
            grouped grpo tenant's rollout carries no (or inconsistent) groups.
    """
    t = as_numpy(samples["t"]).astype(np.int64)
    env = as_numpy(samples["env"]).astype(np.int64)
    horizon, num_envs = int(t.max()) + 1, int(env.max()) + 1
    if t.size != horizon * num_envs or len(set(zip(t.tolist(), env.tolist(), strict=True))) != (
        t.size
    ):
        raise InvalidRequestError(
            f"rollout samples do not tile a [T={horizon}, N={num_envs}] grid "
            f"({t.size} samples, expected {horizon * num_envs} distinct (t, env) pairs)",
            field="t",
        )
    shape = (horizon, num_envs)
    rewards = _time_major(as_numpy(samples["rewards"]).astype(np.float32), t, env, shape)
    dones = _time_major(as_numpy(samples["dones"]).astype(bool), t, env, shape)
    if algorithm.name == "grpo":
        adv, ret = grpo(rewards, dones, group_ids=_group_ids(samples, env, num_envs, algorithm))
    elif algorithm.name == "reinforce":
        ret = discounted_returns(rewards, dones, gamma=algorithm.gamma)
        adv = (ret - ret.mean()).astype(np.float32)
    else:
        value_key = "actor_values" if "actor_values" in samples else "values"
        values = _time_major(as_numpy(samples[value_key]).astype(np.float32), t, env, shape)
        boot = np.zeros(num_envs, dtype=np.float32)
        boot[env] = as_numpy(samples["bootstrap_values"]).astype(np.float32)
        adv, ret = gae(
            rewards, values, dones, boot, gamma=algorithm.gamma, lam=algorithm.gae_lambda
        )
    return {"advantages": adv[t, env].astype(np.float32), "returns": ret[t, env].astype(np.float32)}


def _group_ids(
    samples: Mapping[str, np.ndarray], env: np.ndarray, num_envs: int, algorithm: AlgorithmSpec
) -> np.ndarray | None:
    """``[N]`` group of every env from the samples' ``group`` field (None: ungrouped)."""
    if GROUP not in samples:
        if algorithm.group_size is not None:
            raise InvalidRequestError(
                f"algorithm.group_size={algorithm.group_size}, but the rollout carries no "
                f"{GROUP!r} field (it was not collected as a grouped rollout)",
                field=GROUP,
            )
        return None
    group = as_numpy(samples[GROUP]).astype(np.int64)
    ids = np.full(num_envs, -1, dtype=np.int64)
    ids[env] = group
    if not np.array_equal(ids[env], group):
        raise InvalidRequestError(
            f"rollout field {GROUP!r} is not constant per env: every sample of an env "
            "belongs to the env's group",
            field=GROUP,
        )
    return ids


def _input_fields(algorithm: AlgorithmSpec, available: list[str]) -> list[str]:
    fields = ["rewards", "dones", "t", "env"]
    if algorithm.name == "grpo" and GROUP in available:
        fields += [GROUP]
    if algorithm.name == "ppo":
        fields += ["actor_values" if "actor_values" in available else "values"]
        fields += ["bootstrap_values"]
    return fields


async def advantage_once(ctx: WorkflowContext) -> TrainingJob | None:
    """One advantage-stage iteration (App. A.5 ``advantage_stage``); None if idle.

    Raises:
        Whatever the computation raised, after failing the job and clearing its
        partition (nothing downstream can use a half-derived partition).
    """
    job = ctx.scheduler.lease_stage(
        JobState.NEEDS_ADVANTAGES, ACTOR_ROLE, ctx.domain, JobState.COMPUTING_ADVANTAGES
    )
    if job is None:
        return None
    try:
        tenant = ctx.tenants[job.tenant_id]
        assert tenant.config is not None
        algorithm = tenant.config.algorithm
        info = await ctx.queue.async_info(job.partition_id)
        fields = _input_fields(algorithm, info.fields)
        metas: list[BatchMeta] = []
        columns: dict[str, list[np.ndarray]] = {f: [] for f in fields}
        while True:  # the global batch plan: the whole rollout, in bounded reads
            meta = await ctx.queue.async_get_meta(
                job.partition_id, fields, _READ_CHUNK, ADVANTAGE_TASK
            )
            if meta.is_empty:
                break
            data = await ctx.queue.async_get_data(meta)
            metas.append(meta)
            for f in fields:
                columns[f].append(as_numpy(data[f]))
        if sum(m.size for m in metas) != job.sample_count:
            raise InvalidRequestError(
                f"job {job.job_id}: partition holds {sum(m.size for m in metas)} samples, "
                f"the job declares sample_count={job.sample_count}"
            )
        merged = {f: np.concatenate(v) for f, v in columns.items()}
        derived = compute_advantages(merged, algorithm)
        start = 0
        for meta in metas:
            part = {k: v[start : start + meta.size] for k, v in derived.items()}
            await ctx.queue.async_put(part, meta)
            start += meta.size
        ready = ctx.scheduler.mark(job.job_id, JobState.READY, lease_epoch=job.lease_epoch)
    except BaseException as error:
        await ctx.queue.async_clear(job.partition_id)
        await fail_until_stored(ctx, job.job_id, job.tenant_id, failure_reason(error))
        raise
    return ready


async def actor_forward_once(ctx: WorkflowContext) -> TrainingJob | None:
    """One actor-forward iteration (App. A.5, optional stage); None if idle."""
    job = ctx.scheduler.lease_stage(
        JobState.RESERVED, ACTOR_ROLE, ctx.domain, JobState.COMPUTING_ACTOR_FORWARD
    )
    if job is None:
        return None
    try:
        await ctx.training.actor_forward(job)
        done = ctx.scheduler.mark(
            job.job_id, JobState.NEEDS_ADVANTAGES, lease_epoch=job.lease_epoch
        )
    except BaseException as error:
        # The training role's own failure handling: a slot the role lost while being
        # re-created is not the job's fault.
        await fail_job(ctx, job, error)
        raise
    return done


async def _stage_loop(ctx: WorkflowContext, once_name: str) -> None:
    once = advantage_once if once_name == "advantages" else actor_forward_once
    failed = FailedIteration(ctx, f"{once_name} stage: job failed")
    while True:
        try:
            job = await once(ctx)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the job is failed; the stage keeps serving others
            await failed.after(error)
            continue
        failed.succeeded()
        if job is None:
            await ctx.clock.sleep(ctx.poll_s)


async def advantage_stage(ctx: WorkflowContext) -> None:
    """Serve the advantage stage for every RL tenant until cancelled."""
    await _stage_loop(ctx, "advantages")


async def actor_forward_stage(ctx: WorkflowContext) -> None:
    """Serve the actor-forward stage for tenants whose algorithm enables it."""
    await _stage_loop(ctx, "actor_forward")
