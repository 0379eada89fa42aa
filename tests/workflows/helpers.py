"""Shared helpers of the workflow and runtime tests: tiny specs and recorded demos."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from joynexus.data.record import dataset_features
from joynexus.data.writer import LeRobotDatasetWriter
from joynexus.envs import EnvSpec, make_env
from joynexus.envs.reach2d import Reach2DScriptedPolicy
from joynexus.spec.workload import WorkloadSpec, parse_spec


def record_reach2d_demos(out: Path, *, episodes: int, image_size: int = 32, seed: int = 0) -> Path:
    """Write ``episodes`` expert episodes of reach2d as a LeRobot dataset (PNG frames)."""
    env = make_env(EnvSpec(kind="reach2d", image_size=image_size))
    expert = Reach2DScriptedPolicy()
    schema = env.schema
    writer = LeRobotDatasetWriter.create(
        out,
        repo_id="local/reach2d_scripted",
        fps=int(schema.fps),
        features=dataset_features(schema, use_videos=False),
        robot_type="reach2d",
        use_videos=False,
    )
    with writer:
        for ep in range(episodes):
            obs = env.reset(seed=seed + ep)
            for _ in range(30):
                action = expert.act(env, obs)
                step = env.step(action)
                done = bool(step.terminated[0] or step.truncated[0])
                writer.add_frame(
                    {
                        "observation.images.top": obs.cameras["top"][0],
                        "observation.state": obs.state[0],
                        "action": action[0],
                        "next.reward": np.float32(step.reward[0]),
                        "next.done": done,
                        "next.success": bool(step.success[0]),
                    },
                    task=schema.instruction,
                )
                obs = step.observation
                if done:
                    break
            writer.save_episode()
    env.close()
    return out


def spec(data: dict[str, Any]) -> WorkloadSpec:
    return parse_spec(data)


def rl_spec(
    tenant: str,
    base: str,
    out: Path,
    *,
    kind: str = "reach2d",
    target: int = 2,
    num_envs: int = 2,
    horizon: int = 16,
    staleness: int | None = 4,
    max_in_flight: int = 2,
    extra_algo: dict[str, Any] | None = None,
    episode_steps: int | None = None,
    **top: Any,
) -> WorkloadSpec:
    env: dict[str, Any] = {"kind": kind, "num_envs": num_envs, "image_size": 32}
    if episode_steps is not None:
        env["max_episode_steps"] = episode_steps
    return parse_spec(
        {
            "tenant": tenant,
            "task": "rl",
            "base_model": {"id": base},
            "env": env,
            "algorithm": {
                "name": "ppo",
                "horizon": horizon,
                "microbatch_size": num_envs * horizon,
                **(extra_algo or {}),
            },
            "action_module": {"type": "oft", "hidden_dim": 64, "num_blocks": 1},
            "scheduling": {
                "completion_target": target,
                "max_in_flight": max_in_flight,
                "max_policy_staleness": staleness,
            },
            "output_dir": str(out),
            **top,
        }
    )
