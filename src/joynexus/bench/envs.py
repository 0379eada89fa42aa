"""``joynexus bench envs``: simulator steps per second per adapter.

Rows compare a single env with a vectorized session (``num_envs`` sub-envs) and, for
MuJoCo-rendered envs, fast rendering on and off. ``steps_per_s`` counts sub-env
transitions (a vectorized step of 4 envs is 4 steps), each with a rendered camera
image. Extra rows measure the same simulator through an Environment Service worker
process and through a loopback env server, to show what isolation costs.
JSON: ``{"envs": [{env, image_size, vectorized, num_envs, fast_render, steps_per_s,
path}, ...]}``; ``fast_render`` is null where the simulator has no such switch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from joynexus.envs import EnvSpec, list_envs, make_env

__all__ = ["LIBERO_SUITES", "BenchCase", "default_cases", "print_table", "run_envs_bench"]


@dataclass(frozen=True)
class BenchCase:
    """One row: an env spec, how to sample actions, and which path runs it."""

    name: str
    spec: EnvSpec
    sample: Callable[[np.random.Generator, int], np.ndarray]
    has_fast_render: bool
    path: str = "adapter"  # adapter | service | remote


def _pusht_actions(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(0, 512, size=(n, 2)).astype(np.float32)


def _metaworld_actions(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(-1, 1, size=(n, 4)).astype(np.float32)


def _unit_actions(dim: int) -> Callable[[np.random.Generator, int], np.ndarray]:
    """Uniform actions in [-1, 1]^dim (delta-pose / velocity controllers)."""

    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(-1, 1, size=(n, dim)).astype(np.float32)

    return sample


#: One row per LIBERO suite: its first task, from the benchmark's fixed init states.
LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")


def default_cases(*, num_envs: int = 4, quick: bool = False) -> list[BenchCase]:
    """The benchmark matrix for the adapters available on this machine."""
    available = {info.kind for info in list_envs() if info.available}
    cases: list[BenchCase] = []
    if "pusht" in available:
        for n in (1, num_envs):
            spec = EnvSpec(kind="pusht", image_size=96, num_envs=n)
            cases.append(BenchCase("pusht", spec, _pusht_actions, False))
        one = EnvSpec(kind="pusht", image_size=96)
        cases.append(BenchCase("pusht", one, _pusht_actions, False, path="service"))
        if "remote" in available:
            cases.append(BenchCase("pusht", one, _pusht_actions, False, path="remote"))
    if "metaworld" in available:
        for size in (64,) if quick else (64, 224):
            for fast in (True, False):
                for n in (1, num_envs) if fast else (1,):
                    spec = EnvSpec(
                        kind="metaworld",
                        task="reach-v3",
                        image_size=size,
                        num_envs=n,
                        fast_render=fast,
                    )
                    cases.append(BenchCase("metaworld/reach-v3", spec, _metaworld_actions, True))
    if "reach2d" in available:
        for n in (1, num_envs):
            spec = EnvSpec(kind="reach2d", image_size=64, num_envs=n)
            cases.append(BenchCase("reach2d", spec, _unit_actions(2), False))
    # The heavy simulators: one size, fast render on and off, single env (their CPU
    # backends step sub-envs one after another, so vectorizing adds nothing here).
    heavy = [
        ("aloha", "transfer_cube", 14, "aloha/transfer_cube"),
        ("maniskill", "PickCube-v1", 7, "maniskill/PickCube-v1"),
    ]
    for kind, task, dim, name in heavy if not quick else []:
        if kind not in available:
            continue
        for fast in (True, False):
            spec = EnvSpec(kind=kind, task=task, image_size=128, fast_render=fast)
            cases.append(BenchCase(name, spec, _unit_actions(dim), True))
    if not quick and "libero" in available:
        # Every suite with fast rendering (scenes differ in size: kitchen and living-room
        # scenes of libero_10/90 render more geometry), and one with it off.
        for suite in LIBERO_SUITES:
            for fast in (True, False) if suite == "libero_spatial" else (True,):
                spec = EnvSpec(
                    kind="libero",
                    task=f"{suite}/0",
                    image_size=128,
                    fast_render=fast,
                    options={"init_state_index": 0},
                )
                cases.append(BenchCase(f"libero/{suite}/0", spec, _unit_actions(7), True))
    return cases


def _time_adapter(case: BenchCase, steps: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    env = make_env(case.spec)
    try:
        env.reset(seed=seed)
        env.step(case.sample(rng, env.num_envs))  # warm-up: first render builds GL state
        start = time.perf_counter()
        for _ in range(steps):
            env.step(case.sample(rng, env.num_envs))
        return steps * env.num_envs / (time.perf_counter() - start)
    finally:
        env.close()


def _time_service(case: BenchCase, steps: int, seed: int) -> float:
    from joynexus.services.environment import EnvironmentService

    async def main() -> float:
        rng = np.random.default_rng(seed)
        svc = EnvironmentService()
        try:
            info = await svc.create_session("bench", case.spec)
            await svc.reset(info.session_id, "bench", seed=seed, tenant_id="bench")
            n = info.num_envs
            await svc.step(info.session_id, case.sample(rng, n), tenant_id="bench")
            start = time.perf_counter()
            for _ in range(steps):
                await svc.step(info.session_id, case.sample(rng, n), tenant_id="bench")
            return steps * n / (time.perf_counter() - start)
        finally:
            await svc.aclose()

    return asyncio.run(main())


def _time_remote(case: BenchCase, steps: int, seed: int) -> float:
    from joynexus.envs.env_server import BackgroundEnvServer

    with BackgroundEnvServer(case.spec) as url:
        remote = EnvSpec(kind="remote", num_envs=case.spec.num_envs, options={"url": url})
        return _time_adapter(
            BenchCase(case.name, remote, case.sample, case.has_fast_render), steps, seed
        )


def run_envs_bench(
    *,
    steps: int = 50,
    num_envs: int = 4,
    quick: bool = False,
    cases: list[BenchCase] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every case; returns ``{"envs": [row, ...]}``."""
    steps = min(steps, 10) if quick else steps
    rows = []
    runners = {"adapter": _time_adapter, "service": _time_service, "remote": _time_remote}
    for case in cases if cases is not None else default_cases(num_envs=num_envs, quick=quick):
        label = f"{case.name} n={case.spec.num_envs} {case.spec.image_size}px {case.path}"
        if progress is not None:
            progress(label)
        # Fewer timed steps for slow software-rendered frames keeps the bench short.
        n_steps = steps if case.spec.fast_render or not case.has_fast_render else max(5, steps // 5)
        rate = runners[case.path](case, n_steps, 0)
        rows.append(
            {
                "env": case.name,
                "image_size": case.spec.image_size,
                "vectorized": case.spec.num_envs > 1,
                "num_envs": case.spec.num_envs,
                "fast_render": case.spec.fast_render if case.has_fast_render else None,
                "path": case.path,
                "steps_per_s": round(rate, 2),
            }
        )
    return {"envs": rows}


def print_table(results: dict[str, Any], console: Console) -> None:
    table = Table(title="Environment steps per second (sub-env transitions, with rendering)")
    for col in ("env", "image", "num_envs", "fast render", "path", "steps/s"):
        table.add_column(col, justify="right" if col in ("image", "steps/s") else "left")
    for row in results["envs"]:
        fast = "-" if row["fast_render"] is None else ("on" if row["fast_render"] else "off")
        table.add_row(
            row["env"],
            str(row["image_size"]),
            str(row["num_envs"]),
            fast,
            row["path"],
            f"{row['steps_per_s']:.1f}",
        )
    console.print(table)
