"""An evaluation run in LeRobot's layout: ``eval_info.json`` as ``lerobot-eval`` writes it.

``lerobot-eval`` reports ``per_episode`` records, ``per_task`` metrics lists,
``per_group`` averages and an ``overall`` block with ``avg_sum_reward``,
``avg_max_reward``, ``pc_success`` (percent), ``n_episodes``, ``eval_s`` and
``eval_ep_s``. One JoyNexus evaluation run evaluates one target in one environment,
so it is one task (the env's ``task``, else its ``kind``) of one group (the env's
``kind``) — or, with ``evaluation.tasks``, one entry of ``per_task`` per task
(:func:`eval_info_tasks`). ``video_paths`` stay empty for evaluation workloads (they record no
videos); ``joynexus eval --videos`` fills them. What
LeRobot has no field for (target tenant, policy version, seeds, run) is under
``joynexus``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TaskEpisodes", "eval_info", "eval_info_tasks", "write_eval_info"]


def _averages(sums: Sequence[float], maxes: Sequence[float], ok: Sequence[bool]) -> dict[str, Any]:
    return {
        "avg_sum_reward": float(np.mean(sums)) if sums else float("nan"),
        "avg_max_reward": float(np.mean(maxes)) if maxes else float("nan"),
        "pc_success": 100.0 * float(np.mean(ok)) if ok else float("nan"),
        "n_episodes": len(sums),
        "video_paths": [],
    }


@dataclass(frozen=True)
class TaskEpisodes:
    """One task's episodes of a run: their summed and maximal rewards and successes."""

    task: str
    sum_rewards: Sequence[float]
    max_rewards: Sequence[float]
    successes: Sequence[bool]


def eval_info(
    *,
    group: str,
    task: str,
    sum_rewards: Sequence[float],
    max_rewards: Sequence[float],
    successes: Sequence[bool],
    seeds: Sequence[int] | None,
    eval_s: float,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The ``eval_info.json`` document of one run in one task (see module docstring)."""
    episodes = TaskEpisodes(task, sum_rewards, max_rewards, successes)
    return eval_info_tasks(group=group, tasks=[episodes], seeds=seeds, eval_s=eval_s, extra=extra)


def eval_info_tasks(
    *,
    group: str,
    tasks: Sequence[TaskEpisodes],
    seeds: Sequence[int] | None,
    eval_s: float,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The ``eval_info.json`` document of one run over ``tasks`` (``task_id`` = their
    order; each played the same ``seeds``, when given)."""
    sum_rewards = [float(v) for t in tasks for v in t.sum_rewards]
    max_rewards = [float(v) for t in tasks for v in t.max_rewards]
    successes = [bool(v) for t in tasks for v in t.successes]
    episode_seeds = None if seeds is None else [int(s) for _ in tasks for s in seeds]
    n = len(sum_rewards)
    per_episode = [
        {
            "episode_ix": i,
            "sum_reward": sum_rewards[i],
            "max_reward": max_rewards[i],
            "success": successes[i],
            "seed": None if episode_seeds is None else episode_seeds[i],
        }
        for i in range(n)
    ]
    overall = _averages(sum_rewards, max_rewards, successes)
    overall.update(eval_s=float(eval_s), eval_ep_s=float(eval_s) / n if n else float("nan"))
    return {
        "per_episode": per_episode,
        "per_task": [
            {
                "task_group": group,
                "task_id": task_id,
                "task": t.task,
                "metrics": {
                    "sum_rewards": [float(v) for v in t.sum_rewards],
                    "max_rewards": [float(v) for v in t.max_rewards],
                    "successes": [bool(v) for v in t.successes],
                    "video_paths": [],
                },
            }
            for task_id, t in enumerate(tasks)
        ],
        "per_group": {group: _averages(sum_rewards, max_rewards, successes)},
        "overall": overall,
        "joynexus": {**extra, "seeds": None if seeds is None else [int(s) for s in seeds]},
    }


def write_eval_info(path: Path, info: dict[str, Any]) -> None:
    """Write atomically (a reader never sees half a file; NaN as null, as JSON has none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    text = json.dumps(_nan_to_none(info), indent=2, sort_keys=True)
    tmp.write_text(text)
    os.replace(tmp, path)


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value
