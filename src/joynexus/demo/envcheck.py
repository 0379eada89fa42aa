"""What the demo's simulators need, checked before anything starts.

Two levels, both before the first workload is compiled:

* **Cheap** (:func:`joynexus.envs.unavailable_reason`): the kind's Python modules and
  its ``ready`` check, e.g. LIBERO's scene assets (an asset pack or hf-libero's
  download). It stats files and imports no simulator.
* **Live** (:func:`probe_envs`): each distinct simulator of a profile is built, reset
  and stepped once in its own short-lived process (the start method of the Environment
  Service's workers), all at once, with a deadline. It catches what no file check can:
  a renderer that does not work here (software Vulkan for ManiSkill3, EGL for MuJoCo),
  a driver that crashes the process. The probe's own output is discarded, so a failing
  simulator's traceback never reaches the demo's output; its error's first line does.
"""

from __future__ import annotations

import asyncio
import multiprocessing.connection
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from joynexus.envs.base import EnvSpec
from joynexus.envs.registry import unavailable_reason

__all__ = ["PROBE_TIMEOUT_S", "EnvProblem", "cheap_problems", "env_label", "probe_envs"]

#: How long one simulator may take to build, reset and step once (LIBERO builds in
#: ~6 s and ManiSkill3 in ~5-10 s on a 2-core CPU; all probes run at once).
PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class EnvProblem:
    """Why one simulator of a profile cannot run here."""

    label: str
    kind: str
    reason: str


def env_label(spec: EnvSpec) -> str:
    """``kind`` or ``kind task``, as the demo names a simulator."""
    return f"{spec.kind} {spec.task}" if spec.task else spec.kind


def _distinct(specs: Sequence[EnvSpec]) -> list[EnvSpec]:
    seen: dict[str, EnvSpec] = {}
    for spec in specs:
        seen.setdefault(env_label(spec), spec.model_copy(update={"num_envs": 1}))
    return list(seen.values())


def cheap_problems(specs: Sequence[EnvSpec]) -> list[EnvProblem]:
    """The file-level checks (modules, assets) of every kind among ``specs``."""
    problems: list[EnvProblem] = []
    reasons: dict[str, str | None] = {}
    for spec in _distinct(specs):
        if spec.kind not in reasons:
            reasons[spec.kind] = unavailable_reason(spec.kind)
        reason = reasons[spec.kind]
        if reason is not None:
            problems.append(EnvProblem(env_label(spec), spec.kind, reason))
    return problems


def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line[:limit]


def _probe_main(conn: multiprocessing.connection.Connection, spec_json: str) -> None:
    """Child: build, reset and step one simulator; send back None or the error's line."""
    # Silence the child at the file-descriptor level (C libraries print there too).
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        import numpy as np

        from joynexus.envs import make_env

        spec = EnvSpec.model_validate_json(spec_json)
        env = make_env(spec)
        try:
            env.reset(seed=0)
            env.step(np.zeros((env.num_envs, env.schema.action_dim), dtype=np.float32))
        finally:
            env.close()
        conn.send(None)
    except BaseException as exc:
        message = getattr(exc, "message", None) or str(exc)
        conn.send(f"{type(exc).__name__}: {_first_line(message)}".rstrip(": "))
    finally:
        conn.close()


def _probe_blocking(spec: EnvSpec, timeout_s: float) -> str | None:
    from joynexus.services.env_worker import mp_context

    ctx = mp_context()
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(  # type: ignore[attr-defined]  # BaseContext stubs lack Process
        target=_probe_main,
        args=(child, spec.model_dump_json()),
        daemon=True,
        name=f"joynexus-probe-{spec.kind}",
    )
    process.start()
    child.close()
    deadline = time.monotonic() + timeout_s
    try:
        if not parent.poll(max(0.0, deadline - time.monotonic())):
            if process.is_alive():
                return f"did not build, reset and step within {timeout_s:g} s"
            return f"its process died while starting (exit code {process.exitcode})"
        try:
            answer: str | None = parent.recv()
        except EOFError:
            process.join(5.0)
            return f"its process died while starting (exit code {process.exitcode})"
        return answer
    finally:
        parent.close()
        if process.is_alive():
            process.join(5.0)
        if process.is_alive():
            process.kill()
            process.join(5.0)


async def probe_envs(
    specs: Sequence[EnvSpec], *, timeout_s: float = PROBE_TIMEOUT_S
) -> list[EnvProblem]:
    """Check every distinct simulator among ``specs``: cheap checks, then a live probe
    of those that pass them (all at once); the problems found, in ``specs`` order."""
    distinct = _distinct(specs)
    problems = {p.label: p for p in cheap_problems(distinct)}
    live = [s for s in distinct if env_label(s) not in problems]
    answers = await asyncio.gather(
        *(asyncio.to_thread(_probe_blocking, s, timeout_s) for s in live)
    )
    for spec, answer in zip(live, answers, strict=True):
        if answer is not None:
            problems[env_label(spec)] = EnvProblem(env_label(spec), spec.kind, answer)
    return [problems[env_label(s)] for s in distinct if env_label(s) in problems]
