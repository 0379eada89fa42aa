"""Any gymnasium env id as a JoyNexus env (kind ``"gym"``), e.g. what ``env-server`` serves.

The schema is inferred from the env's spaces:

* ``Dict`` observations: every uint8 ``[H, W, C]`` entry becomes a camera of that name;
  the other ``Box`` entries are flattened and concatenated (sorted by key) into the state.
* ``Box`` image observations: one camera ``"image"``, empty state.
* ``Box`` vector observations: the state; the camera ``"render"`` is the env's
  ``rgb_array`` rendering (every schema has at least one camera).
* Actions: a ``Box`` (flattened) or ``Discrete`` (one dim, rounded and clipped).

``success`` is ``info["is_success"]`` or ``info["success"]`` when present, else false.
Options: ``make_kwargs`` (dict passed to ``gymnasium.make``) and ``imports`` (modules to
import first so they register their ids, e.g. ``["gym_pusht"]``). Both run code in the
process that builds the env, so a server lets tenants use only what its admin listed
(``ServerConfig.gym_allowed_*``, checked by :func:`joynexus.envs.limits.gym_problems`
before anything is built).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np

from joynexus.envs.base import EnvAdapter, EnvSpec
from joynexus.envs.registry import register_env
from joynexus.envs.render import resize_image
from joynexus.envs.vector import SingleEnv, SingleObservation, SingleStep, VectorEnvAdapter
from joynexus.errors import SpecError
from joynexus.models.schema import CameraSpec, DataSchema

__all__ = ["gym_schema", "make_gym"]

_OPTIONS = {"make_kwargs", "imports"}


def _make_raw(spec: EnvSpec) -> Any:
    unknown = set(spec.options) - _OPTIONS
    if unknown:
        raise SpecError(f"unknown gym option(s) {sorted(unknown)}; allowed: {sorted(_OPTIONS)}")
    if not spec.task:
        raise SpecError("kind 'gym' needs task=<gymnasium env id>, e.g. 'CartPole-v1'")
    # Classic-control and pygame-based envs render through SDL: never open a window.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    import gymnasium as gym

    imports = spec.options.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(m, str) for m in imports):
        raise SpecError("gym option 'imports' must be a list of module names")
    make_kwargs = spec.options.get("make_kwargs", {})
    if not isinstance(make_kwargs, dict):
        raise SpecError("gym option 'make_kwargs' must be an object of keyword arguments")
    for module in imports:
        importlib.import_module(module)
    kwargs: dict[str, Any] = {"render_mode": "rgb_array", **make_kwargs}
    if spec.max_episode_steps is not None:
        kwargs["max_episode_steps"] = spec.max_episode_steps
    try:
        return gym.make(spec.task, **kwargs)
    except gym.error.Error as exc:
        raise SpecError(f"gymnasium cannot make {spec.task!r}: {exc}") from exc


def _is_image(space: Any) -> bool:
    return (
        getattr(space, "dtype", None) == np.uint8
        and len(getattr(space, "shape", ()) or ()) == 3
        and space.shape[-1] in (1, 3, 4)
    )


def _hwc(shape: Any) -> tuple[int, int, int]:
    return (int(shape[0]), int(shape[1]), int(shape[2]))


class _Layout:
    """How to turn one raw gym observation into cameras + state."""

    def __init__(self, env: Any, image_size: int | None) -> None:
        from gymnasium import spaces

        obs_space = env.observation_space
        self.image_keys: list[str] = []
        self.state_keys: list[str] = []
        self.render_camera = False
        cams: dict[str, tuple[int, int, int]] = {}
        state_dim = 0
        if isinstance(obs_space, spaces.Dict):
            for key in sorted(obs_space.spaces):
                sub = obs_space.spaces[key]
                if _is_image(sub):
                    self.image_keys.append(key)
                    cams[key] = _hwc(sub.shape)
                elif isinstance(sub, spaces.Box):
                    self.state_keys.append(key)
                    state_dim += int(np.prod(sub.shape))
        elif _is_image(obs_space):
            self.image_keys = [""]
            cams["image"] = _hwc(obs_space.shape)
        elif isinstance(obs_space, spaces.Box):
            state_dim = int(np.prod(obs_space.shape))
            self.render_camera = True
        else:
            raise SpecError(f"unsupported gymnasium observation space {obs_space}")
        if self.render_camera or not cams:
            self.render_camera = True
            env.reset(seed=0)
            frame = env.render()
            if frame is None:
                raise SpecError("the env has no image observation and renders no rgb_array")
            cams["render"] = _hwc(np.asarray(frame).shape)
        act = env.action_space
        if isinstance(act, spaces.Discrete):
            self.discrete: int | None = int(act.n)
            action_dim = 1
        elif isinstance(act, spaces.Box):
            self.discrete = None
            action_dim = int(np.prod(act.shape))
        else:
            raise SpecError(f"unsupported gymnasium action space {act}")
        self.action_shape = getattr(act, "shape", ())
        self.camera_specs = {
            name: CameraSpec(
                height=image_size or shape[0], width=image_size or shape[1], channels=shape[2]
            )
            for name, shape in cams.items()
        }
        self.state_dim = state_dim
        self.action_dim = action_dim


def gym_schema(spec: EnvSpec) -> DataSchema:
    """Infer the schema by building the env once (gymnasium envs are cheap to make)."""
    env = _make_raw(spec)
    try:
        layout = _Layout(env, spec.image_size)
    finally:
        env.close()
    return _schema(spec, layout)


def _schema(spec: EnvSpec, layout: _Layout) -> DataSchema:
    name = "".join(c if c.isalnum() else "-" for c in (spec.task or "gym"))[:64]
    return DataSchema(
        name=name,
        cameras=layout.camera_specs,
        state_dim=layout.state_dim,
        action_dim=layout.action_dim,
    )


class _GymSingle:
    def __init__(self, env: Any, layout: _Layout) -> None:
        self.env = env
        self.layout = layout

    def _obs(self, raw: Any) -> SingleObservation:
        lay = self.layout
        frames: dict[str, np.ndarray] = {}
        if lay.image_keys == [""]:
            frames["image"] = np.asarray(raw)
        else:
            for key in lay.image_keys:
                frames[key] = np.asarray(raw[key])
        if lay.render_camera:
            frames["render"] = np.asarray(self.env.render())
        frames = {
            k: resize_image(v, lay.camera_specs[k].height, lay.camera_specs[k].width)
            for k, v in frames.items()
        }
        if lay.image_keys == [""]:
            state = np.zeros(0, np.float32)
        elif lay.state_keys:
            state = np.concatenate([np.ravel(raw[k]) for k in lay.state_keys])
        elif isinstance(raw, dict):
            state = np.zeros(0, np.float32)
        else:
            state = np.ravel(raw)
        return SingleObservation(cameras=frames, state=np.asarray(state, np.float32))

    def reset(self, seed: int | None) -> SingleObservation:
        raw, _ = self.env.reset(seed=seed)
        return self._obs(raw)

    def step(self, action: np.ndarray) -> SingleStep:
        lay = self.layout
        if lay.discrete is not None:
            act: Any = int(np.clip(np.rint(action[0]), 0, lay.discrete - 1))
        else:
            act = np.asarray(action, np.float32).reshape(lay.action_shape)
        raw, reward, terminated, truncated, info = self.env.step(act)
        success = bool(info.get("is_success", info.get("success", False)))
        return SingleStep(
            observation=self._obs(raw),
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            success=success,
        )

    def close(self) -> None:
        self.env.close()


def make_gym(spec: EnvSpec) -> EnvAdapter:
    """Build ``spec.num_envs`` copies of a gymnasium env id as one adapter."""
    raws = [_make_raw(spec) for _ in range(spec.num_envs)]
    layout = _Layout(raws[0], spec.image_size)
    envs: list[SingleEnv] = [_GymSingle(raw, layout) for raw in raws]
    return VectorEnvAdapter(envs, _schema(spec, layout))


register_env(
    "gym",
    "joynexus.envs.gym_generic:make_gym",
    schema="joynexus.envs.gym_generic:gym_schema",
    description="any gymnasium env id (task=<id>); schema inferred from its spaces",
    requires=["gymnasium"],
)
