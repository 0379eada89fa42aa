"""What the demo's simulators need, checked before anything starts.

Two levels, both before the first workload is compiled:

* **Files** (:func:`joynexus.envs.unavailable_reason`): the kind's Python modules and
  its ``ready`` check, e.g. LIBERO's scene assets (the registry packages, a pack or
  hf-libero's download). It stats files and imports no simulator.
* **Renderers** (:func:`probe_renderers`): the renderer a kind draws its cameras with
  is started once in a short-lived subprocess — MuJoCo on EGL (LIBERO, MetaWorld,
  ALOHA) renders a one-geom scene, SAPIEN on Vulkan (ManiSkill3) takes a picture with
  a camera — all at once, with a deadline. That catches what no file check can (no EGL
  or Vulkan driver, a Mesa too old for SAPIEN) in ~1-7 s instead of the ~13 s a full
  LIBERO or ManiSkill3 build takes. The probe's output is kept from the demo's; the
  error's last line is the reason given.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from joynexus.envs.base import EnvSpec
from joynexus.envs.registry import unavailable_reason

__all__ = [
    "PROBE_TIMEOUT_S",
    "RENDERERS",
    "EnvProblem",
    "check_envs",
    "file_problems",
    "probe_renderers",
]

#: How long one renderer may take to start (SAPIEN's first picture on software Vulkan
#: takes ~7 s on a 2-core CPU: it compiles its shaders).
PROBE_TIMEOUT_S = 90.0

_MUJOCO_EGL = """
import os
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
import mujoco
model = mujoco.MjModel.from_xml_string(
    '<mujoco><worldbody><light pos="0 0 2"/><geom size=".1"/></worldbody></mujoco>'
)
renderer = mujoco.Renderer(model, 16, 16)
renderer.update_scene(mujoco.MjData(model))
assert renderer.render().shape == (16, 16, 3)
renderer.close()
"""

_SAPIEN_VULKAN = """
import sapien
scene = sapien.Scene()
camera = scene.add_camera("probe", 16, 16, 1.0, 0.01, 10.0)
scene.update_render()
camera.take_picture()
assert camera.get_picture("Color").shape[:2] == (16, 16)
"""


@dataclass(frozen=True)
class _Renderer:
    name: str
    code: str
    fix: str


_MUJOCO = _Renderer(
    "MuJoCo on EGL",
    _MUJOCO_EGL,
    "install EGL and Mesa (libegl1 libegl-mesa0 libopengl0 libgl1-mesa-dri: "
    "scripts/install-system-deps.sh), or set MUJOCO_GL to a backend that works here",
)
#: The renderer each kind draws its cameras with (kinds not named need none worth probing:
#: PushT draws with pygame's software surface, reach2d with numpy).
RENDERERS: dict[str, _Renderer] = {
    "libero": _MUJOCO,
    "metaworld": _MUJOCO,
    "aloha": _MUJOCO,
    "maniskill": _Renderer(
        "SAPIEN on Vulkan",
        _SAPIEN_VULKAN,
        "install a Vulkan driver; without a GPU, Mesa >= 24.3's software driver "
        "(mesa-vulkan-drivers: scripts/install-system-deps.sh)",
    ),
}


@dataclass(frozen=True)
class EnvProblem:
    """Why one simulator cannot run here, and what to install or set."""

    kind: str
    reason: str


def _kinds(specs: Sequence[EnvSpec]) -> list[str]:
    return list(dict.fromkeys(spec.kind for spec in specs))


def file_problems(specs: Sequence[EnvSpec]) -> list[EnvProblem]:
    """The file-level checks (Python modules, assets) of every kind among ``specs``."""
    problems = []
    for kind in _kinds(specs):
        reason = unavailable_reason(kind)
        if reason is not None:
            problems.append(EnvProblem(kind, reason))
    return problems


def _last_line(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""


async def _probe(renderer: _Renderer, timeout_s: float) -> str | None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        renderer.code,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return f"{renderer.name} did not start within {timeout_s:g} s; {renderer.fix}"
    if proc.returncode == 0:
        return None
    why = _last_line(err.decode(errors="replace")) or f"exit code {proc.returncode}"
    return f"{renderer.name} does not work here ({why}); {renderer.fix}"


async def probe_renderers(
    kinds: Sequence[str], *, timeout_s: float = PROBE_TIMEOUT_S
) -> dict[str, str]:
    """Start the renderer of every kind among ``kinds`` once (each renderer once, all
    at once); kind -> why its renderer does not work here."""
    wanted = {RENDERERS[k].name: RENDERERS[k] for k in kinds if k in RENDERERS}
    names = list(wanted)
    answers = await asyncio.gather(*(_probe(wanted[n], timeout_s) for n in names))
    failed = {n: a for n, a in zip(names, answers, strict=True) if a is not None}
    return {
        k: failed[RENDERERS[k].name]
        for k in kinds
        if k in RENDERERS and RENDERERS[k].name in failed
    }


async def check_envs(
    specs: Sequence[EnvSpec], *, renderers: bool = True, timeout_s: float = PROBE_TIMEOUT_S
) -> list[EnvProblem]:
    """Files first; when they are all there (and ``renderers``), the renderers. The
    problems found, one per kind, in ``specs`` order (file problems alone when there
    are any: they are known at once, the probes would only delay saying so)."""
    problems = {p.kind: p for p in file_problems(specs)}
    if renderers and not problems:
        rest = [k for k in _kinds(specs) if k not in problems]
        for kind, reason in (await probe_renderers(rest, timeout_s=timeout_s)).items():
            problems[kind] = EnvProblem(kind, reason)
    return [problems[k] for k in _kinds(specs) if k in problems]
