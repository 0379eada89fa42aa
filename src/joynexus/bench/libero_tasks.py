"""``joynexus bench libero-tasks``: every task of LIBERO's suites builds, resets and steps.

For each task: build it from its BDDL file, reset to the benchmark's fixed init state 0,
take a few random steps, and time each stage. What ``bench envs`` samples with one task
per suite, this runs for all 130
(a few minutes per suite on a 2-core CPU, most of it MuJoCo model compilation).
JSON: ``{"tasks": [{suite, index, instruction, build_s, reset_s, steps_per_s, ok,
error}, ...], "suites": {suite: {tasks, ok, steps_per_s}}}``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from joynexus.envs import EnvSpec, make_env
from joynexus.envs.libero import SUITE_MAX_STEPS
from joynexus.errors import SpecError

__all__ = ["check_libero_tasks", "suite_task_count"]


def suite_task_count(suite: str) -> int:
    """Number of tasks in a LIBERO suite (configures hf-libero first)."""
    from joynexus.envs.libero_setup import prepare_libero

    prepare_libero(suite=suite)
    from libero.libero import benchmark

    return int(benchmark.get_benchmark_dict()[suite]().n_tasks)


def _one_task(suite: str, index: int, image_size: int, steps: int) -> dict[str, Any]:
    row: dict[str, Any] = {"suite": suite, "index": index, "ok": False, "error": None}
    start = time.perf_counter()
    env = make_env(
        EnvSpec(
            kind="libero",
            task=f"{suite}/{index}",
            image_size=image_size,
            fast_render=True,
            options={"init_state_index": 0},
        )
    )
    try:
        row["instruction"] = env.schema.instruction
        row["build_s"] = round(time.perf_counter() - start, 2)
        start = time.perf_counter()
        env.reset(seed=0)
        row["reset_s"] = round(time.perf_counter() - start, 2)
        rng = np.random.default_rng(index)
        start = time.perf_counter()
        for _ in range(steps):
            env.step(rng.uniform(-1, 1, size=(1, 7)).astype(np.float32))
        row["steps_per_s"] = round(steps / (time.perf_counter() - start), 2)
        row["ok"] = True
    finally:
        env.close()
    return row


def check_libero_tasks(
    suites: Sequence[str] = tuple(SUITE_MAX_STEPS),
    *,
    image_size: int = 64,
    steps: int = 5,
    limit: int | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Build, reset and step every task (the first ``limit`` of each suite if given)."""
    rows: list[dict[str, Any]] = []
    for suite in suites:
        if suite not in SUITE_MAX_STEPS:
            raise SpecError(f"unknown LIBERO suite {suite!r}; known: {list(SUITE_MAX_STEPS)}")
        count = suite_task_count(suite)
        for index in range(count if limit is None else min(limit, count)):
            try:
                row = _one_task(suite, index, image_size, steps)
            except Exception as exc:  # a task that fails is reported, the rest still run
                row = {"suite": suite, "index": index, "ok": False, "error": repr(exc)[:300]}
            rows.append(row)
            if progress is not None:
                progress(row)
    summary: dict[str, Any] = {}
    for suite in suites:
        mine = [r for r in rows if r["suite"] == suite]
        rates = [r["steps_per_s"] for r in mine if r["ok"]]
        summary[suite] = {
            "tasks": len(mine),
            "ok": sum(r["ok"] for r in mine),
            "steps_per_s": round(float(np.median(rates)), 2) if rates else None,
        }
    return {"tasks": rows, "suites": summary}
