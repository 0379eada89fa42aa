"""Environment loops composed over ``predict`` and the Environment Service (paper §4.2).

* :func:`collect_rollout` — RL data collection: ``horizon`` decisions in every sub-env
  of a session, each decision one ``predict(mode="sample")`` whose action chunk is
  executed open-loop (``action_chunk`` env steps, reward summed over the chunk, done if
  any sub-step ended the episode). It writes the RL partition layout
  (:mod:`joynexus.services.samples`) time-major, sample ``k = t * num_envs + n``. A
  grouped rollout (``RolloutConfig.group_size``, GRPO) resets the sub-envs of each group
  from one seed and records each sample's group.
* :func:`run_evaluation` — read-only episodes at one pinned version; with a ``seed``,
  episode ``j`` starts from a fresh reset with seed ``seed + j`` (fixed, recorded seeds).

A tenant with normalization stats gets env-unit actions from ``predict`` (executed as
they are) and its partition stores the normalized state and actions it trains on.

When a sub-env's episode ends inside a chunk, the env has already auto-reset it; the
rest of that chunk is still applied (all sub-envs step together) and its rewards are
not credited to the finished decision. The next decision then starts a few steps into
the new episode.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from joynexus.envs.base import EnvObservation
from joynexus.errors import InvalidRequestError
from joynexus.models.batch import ObservationBatch
from joynexus.models.normalization import NormalizationStats
from joynexus.models.schema import DataSchema
from joynexus.queues.meta import SampleMeta
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.samples import (
    FLOW_CHAIN,
    GROUP,
    camera_field,
    instructions_array,
)
from joynexus.services.serving import model_actions, model_state

__all__ = [
    "EvalResult",
    "PredictResult",
    "RolloutConfig",
    "RolloutStats",
    "collect_rollout",
    "run_evaluation",
]


@dataclass(frozen=True)
class PredictResult:
    """One ``predict`` answer.

    Attributes:
        actions: ``float32 [B, chunk, A]``.
        log_probs: ``float32 [B]`` in ``"sample"`` mode (Gaussian OFT head, Flow-SDE
            chain of a flow head), else None.
        values: ``float32 [B]`` when the tenant has a critic, else None.
        policy_version: The version that answered.
        chain: ``float32 [B, steps + 1, chunk, A]`` a flow head's Flow-SDE chain in
            model units (``"sample"`` mode), else None.
    """

    actions: np.ndarray
    log_probs: np.ndarray | None
    values: np.ndarray | None
    policy_version: int
    chain: np.ndarray | None = None


class RolloutConfig(BaseModel):
    """Where a rollout runs.

    Attributes:
        tenant_id: The tenant whose policy acts.
        session_id: An Environment Service session owned by the tenant.
        schema_signature: The tenant's interface; stamped on every sample.
        seed: Seed of the env reset (sub-env i gets ``seed + i // group_size``); None
            = unseeded.
        group_size: Sub-envs per group that start from one initial state (GRPO); 1 =
            ungrouped. A grouped rollout needs a seed and stores each sample's group in
            the partition field ``group`` (``env // group_size``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_id: str = Field(min_length=1)
    session_id: str = Field(min_length=1)
    schema_signature: str = Field(min_length=1)
    seed: int | None = None
    group_size: int = Field(default=1, ge=1, le=1024)


@dataclass(frozen=True)
class RolloutStats:
    """Summary of one rollout: finished episodes' returns and success."""

    num_samples: int
    episode_returns: list[float]
    success_rate: float
    mean_reward: float


@dataclass(frozen=True)
class EvalResult:
    """One evaluation run: every decision was served by ``version``."""

    tenant_id: str
    version: int
    episodes: int
    success_rate: float
    mean_return: float
    versions_seen: set[int] = field(default_factory=set)
    #: The reset seed of every episode, in order (empty for an unseeded evaluation).
    seeds: tuple[int, ...] = ()
    #: Per episode, in order: the sum of its rewards, its largest reward, its success
    #: (what LeRobot's eval_info.json reports per episode).
    episode_returns: tuple[float, ...] = ()
    episode_max_rewards: tuple[float, ...] = ()
    episode_successes: tuple[bool, ...] = ()

    @property
    def successes(self) -> int:
        """Successful episodes."""
        return round(self.success_rate * self.episodes)


class Predictor(Protocol):
    def __call__(
        self,
        observations: ObservationBatch,
        tenant_id: str,
        policy_version: int | None = None,
        *,
        mode: Literal["mean", "sample"] = "mean",
    ) -> Awaitable[PredictResult]: ...


def to_batch(obs: EnvObservation) -> ObservationBatch:
    """An env observation of N sub-envs as the tenant's observation batch."""
    return ObservationBatch(
        cameras={k: np.ascontiguousarray(v) for k, v in obs.cameras.items()},
        state=np.ascontiguousarray(obs.state, dtype=np.float32),
        instructions=[obs.instruction] * obs.num_envs,
    )


@dataclass
class _Chunk:
    observation: EnvObservation
    rewards: np.ndarray
    dones: np.ndarray
    finished_returns: list[float]
    finished_success: list[bool]
    finished_envs: list[int]
    finished_max: list[float] = field(default_factory=list)


async def _execute_chunk(
    env: EnvironmentService,
    session_id: str,
    tenant_id: str,
    actions: np.ndarray,
    running: np.ndarray,
    running_max: np.ndarray | None = None,
) -> _Chunk:
    """Apply ``actions [N, chunk, A]`` open-loop; updates ``running`` episode returns
    (and ``running_max``, each episode's largest reward so far, when given)."""
    n = actions.shape[0]
    rewards = np.zeros(n, np.float32)
    dones = np.zeros(n, bool)
    returns: list[float] = []
    success: list[bool] = []
    which: list[int] = []
    maxes: list[float] = []
    obs: EnvObservation | None = None
    for j in range(actions.shape[1]):
        step = await env.step(session_id, actions[:, j], tenant_id=tenant_id)
        live = ~dones
        r = np.asarray(step.reward, np.float32)
        rewards[live] += r[live]
        running[live] += r[live]
        if running_max is not None:
            running_max[live] = np.maximum(running_max[live], r[live])
        ended = live & (np.asarray(step.terminated) | np.asarray(step.truncated))
        for i in np.flatnonzero(ended):
            returns.append(float(running[i]))
            success.append(bool(step.success[i]))
            which.append(int(i))
            running[i] = 0.0
            if running_max is not None:
                maxes.append(float(running_max[i]))
                running_max[i] = -np.inf
        dones |= ended
        obs = step.observation
    assert obs is not None
    return _Chunk(obs, rewards, dones, returns, success, which, maxes)


async def collect_rollout(
    predict: Predictor,
    env: EnvironmentService,
    queue: TrainingQueue,
    schema: DataSchema,
    config: RolloutConfig,
    *,
    job_id: str,
    partition_id: str,
    num_envs: int,
    horizon: int,
    version: int,
    heartbeat: Callable[[], None] | None = None,
    normalization: NormalizationStats | None = None,
) -> RolloutStats:
    """Run ``horizon`` decisions at ``version`` and ``queue_put`` them into the partition.

    ``normalization``: the tenant's stats; the stored state and actions are normalized
    with them (``predict`` answers in env units).

    Raises:
        InvalidRequestError: ``horizon`` < 1, a session with another ``num_envs``, or
            a head without log-probs (RL needs a Gaussian OFT head).
    """
    if horizon < 1:
        raise InvalidRequestError(f"horizon must be >= 1, got {horizon}", field="horizon")
    tid, sid = config.tenant_id, config.session_id
    group_size = config.group_size
    obs = await env.reset(sid, job_id, config.seed, tenant_id=tid, group_size=group_size)
    if obs.num_envs != num_envs:
        raise InvalidRequestError(
            f"session {sid!r} runs {obs.num_envs} sub-envs, the rollout asked for {num_envs}",
            field="num_envs",
        )
    cams: dict[str, list[np.ndarray]] = {c: [] for c in schema.camera_names}
    cols: dict[str, list[np.ndarray]] = {
        k: []
        for k in ("state", "instruction", "actions", "log_probs", "values", "rewards", "dones")
    }
    running = np.zeros(num_envs, np.float64)
    returns: list[float] = []
    success: list[bool] = []
    for _t in range(horizon):
        if heartbeat is not None:
            heartbeat()
        batch = to_batch(obs)
        res = await predict(batch, tid, version, mode="sample")
        if res.log_probs is None:
            raise InvalidRequestError(
                f"tenant {tid!r}: rollout needs log-probs of sampled actions; its action "
                "module gives none (RL needs a Gaussian 'oft' or a 'flow_matching' head)",
                tenant_id=tid,
            )
        chunk = await _execute_chunk(env, sid, tid, res.actions, running)
        for c in schema.camera_names:
            cams[c].append(batch.cameras[c])
        cols["state"].append(model_state(batch.state, normalization))
        cols["instruction"].append(instructions_array(batch.instructions))
        cols["actions"].append(model_actions(res.actions, normalization).astype(np.float32))
        cols["log_probs"].append(res.log_probs.astype(np.float32))
        values = res.values if res.values is not None else np.zeros(num_envs, np.float32)
        cols["values"].append(values.astype(np.float32))
        if res.chain is not None:
            cols.setdefault(FLOW_CHAIN, []).append(res.chain.astype(np.float32))
        cols["rewards"].append(chunk.rewards)
        cols["dones"].append(chunk.dones)
        returns += chunk.finished_returns
        success += chunk.finished_success
        obs = chunk.observation
    if heartbeat is not None:
        heartbeat()
    last = await predict(to_batch(obs), tid, version, mode="mean")
    bootstrap = (
        last.values.astype(np.float32)
        if last.values is not None
        else np.zeros(num_envs, np.float32)
    )
    data: dict[str, np.ndarray] = {camera_field(c): np.concatenate(v) for c, v in cams.items()}
    data.update({k: np.concatenate(v) for k, v in cols.items()})
    data["t"] = np.repeat(np.arange(horizon, dtype=np.int64), num_envs)
    data["env"] = np.tile(np.arange(num_envs, dtype=np.int64), horizon)
    data["bootstrap_values"] = np.tile(bootstrap, horizon)
    if group_size > 1:  # what the advantage stage normalizes GRPO returns within
        data[GROUP] = data["env"] // group_size
    meta = SampleMeta(
        tenant_id=tid, schema_signature=config.schema_signature, behavior_policy_version=version
    )
    await queue.async_queue_put(partition_id, data, meta)
    rewards = data["rewards"]
    return RolloutStats(
        num_samples=horizon * num_envs,
        episode_returns=returns,
        success_rate=float(np.mean(success)) if success else 0.0,
        mean_reward=float(rewards.mean()),
    )


async def run_evaluation(
    predict: Predictor,
    env: EnvironmentService,
    *,
    tenant_id: str,
    session_id: str,
    session_tenant: str,
    episodes: int,
    version: int,
    deterministic: bool,
    seed: int | None = None,
    max_decisions: int = 100_000,
) -> EvalResult:
    """Run decisions at ``version`` until ``episodes`` episodes have finished.

    Unseeded, the first ``episodes`` episodes to end count (auto-resets included).
    Seeded, the episodes are fixed: rounds of one episode per sub-env, each round a
    fresh reset, so episode ``j`` starts from seed ``seed + j`` at its first decision
    (a sub-env that finishes early runs on, uncounted, until the round ends).

    Raises:
        InvalidRequestError: ``episodes`` < 1, or the episodes do not end within
            ``max_decisions`` decisions (set ``max_episode_steps`` on the env).
    """
    if episodes < 1:
        raise InvalidRequestError(f"episodes must be >= 1, got {episodes}", field="episodes")
    mode: Literal["mean", "sample"] = "mean" if deterministic else "sample"
    seen: set[int] = set()
    budget = [max_decisions]

    async def decide(obs: EnvObservation, running: np.ndarray, peak: np.ndarray) -> _Chunk:
        if budget[0] <= 0:
            raise InvalidRequestError(
                f"evaluation of tenant {tenant_id!r}: {episodes} episodes did not end within "
                f"{max_decisions} decisions",
                tenant_id=tenant_id,
            )
        budget[0] -= 1
        res = await predict(to_batch(obs), tenant_id, version, mode=mode)
        seen.add(res.policy_version)
        return await _execute_chunk(env, session_id, session_tenant, res.actions, running, peak)

    job = f"eval-{tenant_id}-v{version}"
    returns: list[float] = []
    success: list[bool] = []
    maxes: list[float] = []
    if seed is None:
        obs = await env.reset(session_id, job, None, tenant_id=session_tenant)
        running = np.zeros(obs.num_envs, np.float64)
        peak = np.full(obs.num_envs, -np.inf)
        while len(returns) < episodes:
            chunk = await decide(obs, running, peak)
            returns += chunk.finished_returns
            success += chunk.finished_success
            maxes += chunk.finished_max
            obs = chunk.observation
        returns, success, maxes = returns[:episodes], success[:episodes], maxes[:episodes]
    else:
        while len(returns) < episodes:
            first = seed + len(returns)
            obs = await env.reset(session_id, f"{job}-s{first}", first, tenant_id=session_tenant)
            wanted = min(obs.num_envs, episodes - len(returns))
            ended: dict[int, tuple[float, bool, float]] = {}
            running = np.zeros(obs.num_envs, np.float64)
            peak = np.full(obs.num_envs, -np.inf)
            while len(ended) < wanted:
                chunk = await decide(obs, running, peak)
                for i, ret, ok, top in zip(
                    chunk.finished_envs,
                    chunk.finished_returns,
                    chunk.finished_success,
                    chunk.finished_max,
                    strict=True,
                ):
                    if i < wanted and i not in ended:  # later episodes of a sub-env: uncounted
                        ended[i] = (ret, ok, top)
                obs = chunk.observation
            returns += [ended[i][0] for i in range(wanted)]
            success += [ended[i][1] for i in range(wanted)]
            maxes += [ended[i][2] for i in range(wanted)]
    return EvalResult(
        tenant_id=tenant_id,
        version=version,
        episodes=episodes,
        success_rate=float(np.mean(success)),
        mean_return=float(np.mean(returns)),
        versions_seen=seen,
        seeds=() if seed is None else tuple(range(seed, seed + episodes)),
        episode_returns=tuple(returns),
        episode_max_rewards=tuple(maxes),
        episode_successes=tuple(success),
    )
