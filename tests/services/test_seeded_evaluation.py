"""Evaluation on fixed seeds: episode j starts from a fresh reset with seed + j."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import numpy as np
import pytest

from joynexus.envs.base import EnvObservation, EnvStep
from joynexus.errors import InvalidRequestError
from joynexus.models.batch import ObservationBatch
from joynexus.services.environment import EnvironmentService
from joynexus.services.rollout import PredictResult, run_evaluation


class SeededEnv:
    """Sub-envs whose episode outcome is a function of the seed it was reset with.

    Episode length is ``1 + seed % 3`` steps; an episode succeeds when its seed is a
    multiple of 3. Auto-reset continues sub-env ``i`` with seed ``s + i + N``, like
    :class:`joynexus.envs.vector.VectorEnvAdapter`.
    """

    def __init__(self, num_envs: int) -> None:
        self.n = num_envs
        self.seeds = np.zeros(num_envs, np.int64)
        self.steps = np.zeros(num_envs, np.int64)
        self.resets: list[int | None] = []

    def _obs(self) -> EnvObservation:
        return EnvObservation(
            cameras={}, state=self.seeds.astype(np.float32)[:, None], instruction="x"
        )

    async def reset(
        self, session_id: str, rollout_id: str, seed: int | None = None, *, tenant_id: str
    ) -> EnvObservation:
        self.resets.append(seed)
        base = 0 if seed is None else seed
        self.seeds = base + np.arange(self.n)
        self.steps[:] = 0
        return self._obs()

    async def step(self, session_id: str, actions: Any, *, tenant_id: str) -> EnvStep:
        self.steps += 1
        ended = self.steps >= 1 + self.seeds % 3
        success = ended & (self.seeds % 3 == 0)
        self.seeds[ended] += self.n
        self.steps[ended] = 0
        return EnvStep(
            observation=self._obs(),
            reward=np.where(ended, self.seeds - self.n, 0).astype(np.float32),
            terminated=ended,
            truncated=np.zeros(self.n, bool),
            success=success,
        )


async def _predict(
    observations: ObservationBatch, tenant_id: str, policy_version: int | None = None, **_: Any
) -> PredictResult:
    n = observations.state.shape[0]
    return PredictResult(np.zeros((n, 2, 1), np.float32), None, None, policy_version or 0)


def _evaluate(env: SeededEnv, episodes: int, seed: int | None, **kw: Any) -> Any:
    return asyncio.run(
        run_evaluation(
            _predict,
            cast(EnvironmentService, env),
            tenant_id="t",
            session_id="s",
            session_tenant="t",
            episodes=episodes,
            version=3,
            deterministic=True,
            seed=seed,
            **kw,
        )
    )


@pytest.mark.parametrize("num_envs", [1, 3, 4])
def test_episode_j_runs_seed_plus_j_whatever_the_sub_env_count(num_envs: int) -> None:
    env = SeededEnv(num_envs)
    result = _evaluate(env, 10, 100)
    seeds = list(range(100, 110))
    assert result.seeds == tuple(seeds)
    assert result.successes == sum(s % 3 == 0 for s in seeds)  # 102, 105, 108
    # The return of each episode is its own seed: the mean is over exactly those seeds.
    assert result.mean_return == pytest.approx(np.mean(seeds))
    # Every round starts from a fresh reset at the next unplayed seed.
    assert env.resets == list(range(100, 110, num_envs))
    assert result.versions_seen == {3}


def test_the_same_seeds_give_the_same_rate_on_another_sub_env_count() -> None:
    rates = {n: _evaluate(SeededEnv(n), 12, 7).success_rate for n in (1, 2, 5)}
    assert len(set(rates.values())) == 1


def test_unseeded_evaluation_counts_the_first_episodes_to_end() -> None:
    # Without seeds, short episodes finish first and are over-represented: this is
    # why the success measurement always passes seeds.
    env = SeededEnv(3)
    result = _evaluate(env, 3, None)
    assert env.resets == [None] and result.seeds == ()


def test_a_round_that_never_ends_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="did not end"):
        _evaluate(SeededEnv(2), 4, 2, max_decisions=1)
