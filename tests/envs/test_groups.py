"""Grouped resets (GRPO's rollouts per initial state): one seed per group of sub-envs."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from starlette.testclient import TestClient

from joynexus.envs import EnvObservation, EnvSpec, make_env
from joynexus.envs.env_server import create_env_server_app
from joynexus.envs.reach2d import Reach2DScriptedPolicy
from joynexus.envs.remote import RemoteEnvAdapter
from joynexus.errors import InvalidRequestError


def _rows_equal(obs: EnvObservation, i: int, j: int) -> bool:
    return np.array_equal(obs.state[i], obs.state[j]) and all(
        np.array_equal(frames[i], frames[j]) for frames in obs.cameras.values()
    )


def test_grouped_reset_seeds_each_group_once_and_auto_resets_by_ordinal() -> None:
    # fake: state[1] is the sub-env's reset seed; every episode lasts 2 steps.
    env = make_env(EnvSpec(kind="fake", num_envs=4, options={"episode_len": 2}))
    try:
        assert env.reset(seed=10, group_size=2).state[:, 1].tolist() == [10, 10, 11, 11]
        seeds = []
        for _ in range(4):
            step = env.step(np.zeros((4, 2), np.float32))
            if step.terminated.any():
                seeds.append(step.observation.state[:, 1].tolist())
        # The k-th episode of group g starts from seed + g + k * (num_envs / group_size).
        assert seeds == [[12, 12, 13, 13], [14, 14, 15, 15]]
        # Ungrouped, as before: seed + i, then seed + i + k * num_envs.
        assert env.reset(seed=10).state[:, 1].tolist() == [10, 11, 12, 13]
        env.step(np.zeros((4, 2), np.float32))
        assert env.step(np.zeros((4, 2), np.float32)).observation.state[:, 1].tolist() == [
            14,
            15,
            16,
            17,
        ]
    finally:
        env.close()


def test_reach2d_group_members_start_from_one_initial_state_in_every_episode() -> None:
    env = make_env(EnvSpec(kind="reach2d", num_envs=4, image_size=16, max_episode_steps=40))
    expert = Reach2DScriptedPolicy()
    try:
        obs = env.reset(seed=3, group_size=2)
        assert _rows_equal(obs, 0, 1) and _rows_equal(obs, 2, 3)
        assert not np.array_equal(obs.state[0], obs.state[2])  # groups differ
        # Sub-env 0 follows the expert (ends early, on success), sub-env 1 stands still
        # (truncated at 40 steps): their second episodes start at different steps but
        # from the same initial state.
        second: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for t in range(40):
            actions = expert.act(env, obs)
            actions[1] = 0.0
            step = env.step(actions)
            ended = step.terminated | step.truncated
            for i in (0, 1):
                if ended[i] and i not in second:
                    second[i] = (step.observation.state[i], step.observation.cameras["top"][i])
                    assert (t < 39) == (i == 0)  # the expert finished first
            obs = step.observation
        assert set(second) == {0, 1}
        np.testing.assert_array_equal(second[0][0], second[1][0])
        np.testing.assert_array_equal(second[0][1], second[1][1])
        assert not np.array_equal(second[0][0], env.reset(seed=3, group_size=2).state[0])
    finally:
        env.close()


def test_metaworld_group_members_start_from_one_initial_state() -> None:
    pytest.importorskip("metaworld")
    spec = EnvSpec(kind="metaworld", task="reach-v3", num_envs=4, image_size=16)
    env = make_env(spec)
    try:
        obs = env.reset(seed=1, group_size=2)
        assert _rows_equal(obs, 0, 1) and _rows_equal(obs, 2, 3)
        # Seeds 1 and 2 draw different goals of MT1's 50 variations.
        assert not np.array_equal(obs.state[0], obs.state[2])
    finally:
        env.close()


def test_a_group_size_that_does_not_divide_num_envs_is_refused() -> None:
    env = make_env(EnvSpec(kind="fake", num_envs=4))
    try:
        with pytest.raises(InvalidRequestError, match=r"group_size=3 does not divide num_envs=4"):
            env.reset(seed=0, group_size=3)
        with pytest.raises(InvalidRequestError, match="positive integer"):
            env.reset(seed=0, group_size=0)
    finally:
        env.close()


def test_remote_grouped_reset_matches_the_local_one() -> None:
    served = EnvSpec(kind="fake", options={"episode_len": 2})
    local = make_env(served.model_copy(update={"num_envs": 4}))
    with TestClient(create_env_server_app(served, max_sessions=1)) as client:
        spec = EnvSpec(kind="remote", num_envs=4, options={"url": "http://testserver"})
        remote = RemoteEnvAdapter(spec, client=client)
        try:
            np.testing.assert_array_equal(
                remote.reset(seed=7, group_size=2).state, local.reset(seed=7, group_size=2).state
            )
            actions = np.zeros((4, 2), np.float32)
            remote.step(actions)
            local.step(actions)
            np.testing.assert_array_equal(
                remote.step(actions).observation.state, local.step(actions).observation.state
            )
            with pytest.raises(InvalidRequestError, match="does not divide"):
                remote.reset(seed=7, group_size=3)
        finally:
            remote.close()
            local.close()


def test_libero_groups_walk_the_fixed_init_states_together() -> None:
    from joynexus.envs.registry import unavailable_reason

    # The registry asset packages of the install make it available (tests/envs/test_libero.py).
    if importlib.util.find_spec("libero") is None:
        pytest.skip("hf-libero is not installed")
    assert unavailable_reason("libero") is None, unavailable_reason("libero")
    spec = EnvSpec(
        kind="libero",
        task="libero_spatial/0",
        num_envs=2,
        image_size=16,
        max_episode_steps=1,
        options={"init_state_index": 3},
    )
    env = make_env(spec)
    try:
        subs = env.envs  # type: ignore[attr-defined]  # a VectorEnvAdapter's sub-envs
        init = np.asarray(subs[0].init_states)

        def sim_states() -> list[np.ndarray]:
            return [np.asarray(sub.env.get_sim_state()) for sub in subs]

        env.reset(seed=0, group_size=2)  # one group: both from init state 3 ...
        for state in sim_states():
            np.testing.assert_allclose(state, init[3])
        env.step(np.zeros((2, 7), np.float32))  # ... then both from 4 (one group)
        for state in sim_states():
            np.testing.assert_allclose(state, init[4])
        env.reset(seed=0)  # ungrouped: 3 and 4, then 5 and 6
        np.testing.assert_allclose(sim_states()[1], init[4])
        env.step(np.zeros((2, 7), np.float32))
        np.testing.assert_allclose(sim_states()[1], init[6])
    finally:
        env.close()
