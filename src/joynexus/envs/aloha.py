"""gym-aloha adapter: the bimanual ALOHA insertion and cube-transfer tasks (dm_control/MuJoCo).

Tasks: ``"transfer_cube"`` and ``"insertion"`` (the gym ids ``AlohaTransferCube-v0`` /
``AlohaInsertion-v0``, with or without the ``gym_aloha/`` prefix, work too).

What a tenant sees: the requested cameras (default ``top``, as in the LeRobot ALOHA
datasets; also ``angle`` and ``front_close``), state 14 = both arms' six joint angles and
normalized gripper openings, actions 14 = absolute joint targets in the same layout
(passed through unclipped: they are radians, not [-1, 1]). Reward is the task's staged
reward 0-4; reaching 4 is success and terminates. Episodes are truncated after 300 steps
unless ``max_episode_steps`` says otherwise.

Speed: stock gym-aloha renders three 480×640 cameras on every step (~1.5 steps/s with
software rendering) whatever the observation asks for. This adapter renders only the
requested cameras, at the requested size: with ``image_size`` set, a camera is rendered
at ``image_size`` high in the native 4:3 aspect and resized to a square (the whole view is
kept); without it, images are the native 480×640. ``fast_render`` (default on) also
turns off shadows, reflections and multisampling.

Options: ``cameras`` (list of camera names, default ``["top"]``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from joynexus.envs.base import EnvAdapter, EnvSpec
from joynexus.envs.registry import register_env
from joynexus.envs.render import ensure_headless_gl, resize_image
from joynexus.envs.vector import SingleEnv, SingleObservation, SingleStep, VectorEnvAdapter
from joynexus.errors import SpecError
from joynexus.models.schema import CameraSpec, DataSchema

__all__ = ["CAMERAS", "DEFAULT_MAX_STEPS", "TASKS", "aloha_schema", "make_aloha"]

CAMERAS = ("top", "angle", "front_close")
TASKS = {
    "transfer_cube": "pick up the cube with the right arm and hand it over to the left arm",
    "insertion": "pick up the peg and the socket and insert the peg into the socket",
}
_GYM_IDS = {"AlohaTransferCube-v0": "transfer_cube", "AlohaInsertion-v0": "insertion"}
DEFAULT_MAX_STEPS = 300  # what gym-aloha registers its ids with
_NATIVE_HEIGHT, _NATIVE_WIDTH = 480, 640
_MAX_REWARD = 4
_OPTIONS = {"cameras"}


def _task(spec: EnvSpec) -> str:
    name = (spec.task or "").removeprefix("gym_aloha/")
    name = _GYM_IDS.get(name, name)
    if name not in TASKS:
        raise SpecError(f"aloha task {spec.task!r} is not one of {sorted(TASKS)}")
    return name


def _cameras(spec: EnvSpec) -> tuple[str, ...]:
    unknown = set(spec.options) - _OPTIONS
    if unknown:
        raise SpecError(f"unknown aloha option(s) {sorted(unknown)}; allowed: {sorted(_OPTIONS)}")
    cams = spec.options.get("cameras", ["top"])
    if (
        not isinstance(cams, list | tuple)
        or not cams
        or any(c not in CAMERAS for c in cams)
        or len(set(cams)) != len(cams)
    ):
        raise SpecError(f"aloha cameras must be a non-empty list of distinct {list(CAMERAS)}")
    return tuple(str(c) for c in cams)


def aloha_schema(spec: EnvSpec) -> DataSchema:
    """The ALOHA schema: the requested cameras, state 14, action 14, 50 Hz."""
    task = _task(spec)
    cams = _cameras(spec)
    if spec.image_size is None:
        camera = CameraSpec(height=_NATIVE_HEIGHT, width=_NATIVE_WIDTH)
    else:
        camera = CameraSpec(height=spec.image_size, width=spec.image_size)
    return DataSchema(
        name="aloha",
        cameras=dict.fromkeys(cams, camera),
        state_dim=14,
        action_dim=14,
        action_chunk=50,
        fps=50.0,
        instruction=TASKS[task],
    )


def _render_size(spec: EnvSpec) -> tuple[int, int]:
    if spec.image_size is None:
        return _NATIVE_HEIGHT, _NATIVE_WIDTH
    return spec.image_size, round(spec.image_size * _NATIVE_WIDTH / _NATIVE_HEIGHT)


class _AlohaSingle:
    def __init__(self, spec: EnvSpec, schema: DataSchema) -> None:
        ensure_headless_gl()
        from gym_aloha.env import AlohaEnv

        self.task = _task(spec)
        self.cams = _cameras(spec)
        self.out_h = schema.cameras[self.cams[0]].height
        self.out_w = schema.cameras[self.cams[0]].width
        self.fast = spec.fast_render
        render_h, render_w = _render_size(spec)
        self.env: Any = AlohaEnv(
            task=self.task,
            obs_type="pixels_agent_pos",
            observation_height=render_h,
            observation_width=render_w,
        )
        dm_env = self.env._env
        physics = dm_env.physics
        if self.fast:
            # Read when the offscreen framebuffer is created, i.e. at the first render.
            physics.model.vis.quality.offsamples = 0
        overrides = {"shadow": False, "reflection": False} if self.fast else None
        cams = self.cams

        def observe(physics: Any) -> OrderedDict[str, Any]:
            # Replaces the task's own observation, which renders three full-size cameras.
            task = dm_env.task
            obs: OrderedDict[str, Any] = OrderedDict()
            obs["qpos"] = task.get_qpos(physics)
            obs["qvel"] = task.get_qvel(physics)
            obs["env_state"] = task.get_env_state(physics)
            obs["images"] = {
                cam: physics.render(
                    height=render_h,
                    width=render_w,
                    camera_id=cam,
                    render_flag_overrides=overrides,
                )
                for cam in cams
            }
            return obs

        dm_env.task.get_observation = observe
        # gym-aloha's formatting only forwards the "top" image; keep every rendered camera.
        self.env._format_raw_obs = lambda raw: {
            "pixels": dict(raw["images"]),
            "agent_pos": raw["qpos"],
        }

    def _obs(self, raw: dict[str, Any]) -> SingleObservation:
        cameras = {
            cam: resize_image(np.asarray(raw["pixels"][cam]), self.out_h, self.out_w)
            for cam in self.cams
        }
        return SingleObservation(cameras=cameras, state=np.asarray(raw["agent_pos"], np.float32))

    def reset(self, seed: int | None) -> SingleObservation:
        raw, _ = self.env.reset(seed=seed)
        return self._obs(raw)

    def step(self, action: np.ndarray) -> SingleStep:
        raw, reward, _, truncated, _ = self.env.step(np.asarray(action, dtype=np.float64))
        success = bool(reward == _MAX_REWARD)
        return SingleStep(
            observation=self._obs(raw),
            reward=float(reward),
            terminated=success,
            truncated=bool(truncated),
            success=success,
        )

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            # dm_control frees its GL contexts with the physics; closing avoids exit noise.
            env._env.physics.free()
            env.close()


def make_aloha(spec: EnvSpec) -> EnvAdapter:
    """Build a (possibly vectorized) gym-aloha adapter from ``spec``.

    Raises:
        SpecError: Unknown task or option.
    """
    schema = aloha_schema(spec)
    envs: list[SingleEnv] = [_AlohaSingle(spec, schema) for _ in range(spec.num_envs)]
    return VectorEnvAdapter(
        envs, schema, max_episode_steps=spec.max_episode_steps or DEFAULT_MAX_STEPS
    )


register_env(
    "aloha",
    "joynexus.envs.aloha:make_aloha",
    schema="joynexus.envs.aloha:aloha_schema",
    description="gym-aloha bimanual tasks (transfer_cube, insertion): state 14, action 14",
    requires=["gym_aloha", "dm_control", "mujoco"],
)
