"""MetaWorld adapter: MT1 tasks through the classic ``MT1`` + ``set_task`` API, one camera.

State is MetaWorld's 39-D observation, actions are 4-D (end-effector delta xyz and
gripper) in [-1, 1]. ``success`` comes from MetaWorld's ``info["success"]``; by default
a successful step also terminates the episode (``options.terminate_on_success``), as
evaluation expects. MuJoCo renders through EGL (``MUJOCO_GL=egl`` unless set).

``fast_render`` (default on) turns off the shadow map, reflections and MSAA, which
dominate software-rendering time. Seeding: ``reset(seed=s)`` draws which of MT1's 50
goal variations each sub-env starts with from ``s`` (MetaWorld ignores gym seeds).

Options: ``camera`` (default ``"corner"``; also ``corner2``, ``corner3``, ``topview``,
``behindGripper``, ``gripperPOV``), ``terminate_on_success`` (default true),
``reward_mode``: ``dense`` (default, MetaWorld's shaped reward, 0–10 a step) or
``sparse`` (1 on a successful step, else 0: the binary success reward of GRPO as
SimpleVLA-RL trains it; with ``terminate_on_success`` an episode's return is exactly its
success. A dense return instead grows with the steps spent *before* success, so it
rewards reaching the goal late).

Observation choices (``EnvSpec.observation``): ``state`` ``default`` / ``privileged``
is the full 39-D observation (it holds the objects' poses and the goal), ``proprio``
the hand position and gripper opening (4); ``images: false`` renders nothing (a black
frame fills the camera), which makes a step ~50× cheaper on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from joynexus.envs.base import EnvAdapter, EnvSpec
from joynexus.envs.registry import register_env
from joynexus.envs.render import ensure_headless_gl, mujoco_fast_render, mujoco_render_rgb
from joynexus.envs.vector import SingleEnv, SingleObservation, SingleStep, VectorEnvAdapter
from joynexus.errors import SpecError
from joynexus.models.schema import METAWORLD, CameraSpec, DataSchema

__all__ = [
    "CAMERAS",
    "DEFAULT_IMAGE_SIZE",
    "full_states",
    "make_metaworld",
    "metaworld_schema",
]

DEFAULT_IMAGE_SIZE = 224
CAMERAS = ("corner", "corner2", "corner3", "topview", "behindGripper", "gripperPOV")
_OPTIONS = {"camera", "terminate_on_success", "reward_mode"}
REWARD_MODES = ("dense", "sparse")
# MetaWorld's corner cameras are mounted rotated by 180°; serve images upright.
_UPSIDE_DOWN = frozenset({"corner", "corner2", "corner3"})


@dataclass(frozen=True)
class _Options:
    camera: str
    terminate_on_success: bool
    sparse: bool


def _options(spec: EnvSpec) -> _Options:
    unknown = set(spec.options) - _OPTIONS
    if unknown:
        raise SpecError(
            f"unknown metaworld option(s) {sorted(unknown)}; allowed: {sorted(_OPTIONS)}"
        )
    camera = str(spec.options.get("camera", "corner"))
    if camera not in CAMERAS:
        raise SpecError(f"metaworld camera {camera!r} is not one of {list(CAMERAS)}")
    reward_mode = spec.options.get("reward_mode", "dense")
    if reward_mode not in REWARD_MODES:
        raise SpecError(f"metaworld reward_mode {reward_mode!r} is not one of {list(REWARD_MODES)}")
    return _Options(
        camera=camera,
        terminate_on_success=bool(spec.options.get("terminate_on_success", True)),
        sparse=reward_mode == "sparse",
    )


def _task(spec: EnvSpec) -> str:
    if not spec.task:
        raise SpecError("metaworld needs a task, e.g. task='reach-v3' (an MT1 task name)")
    return spec.task


#: The robot's own part of MetaWorld's observation: hand xyz and gripper opening.
_PROPRIO_DIM = 4


def metaworld_schema(spec: EnvSpec) -> DataSchema:
    """The MetaWorld schema: one camera at ``spec.image_size`` (default 224), state 39
    (4 with ``observation.state: proprio``)."""
    camera = _options(spec).camera
    task = _task(spec)
    size = spec.image_size or DEFAULT_IMAGE_SIZE
    instruction = task.rsplit("-v", 1)[0].replace("-", " ")
    update: dict[str, Any] = {
        "cameras": {camera: CameraSpec(height=size, width=size)},
        "instruction": instruction,
    }
    if spec.observation.state == "proprio":
        update["state_dim"] = _PROPRIO_DIM
    return METAWORLD.model_copy(update=update)


class _MetaWorldSingle:
    def __init__(self, spec: EnvSpec, schema: DataSchema, options: _Options) -> None:
        ensure_headless_gl()
        import metaworld

        task = _task(spec)
        if task not in metaworld.MT1.ENV_NAMES:
            raise SpecError(
                f"unknown MetaWorld MT1 task {task!r}; known: {', '.join(metaworld.MT1.ENV_NAMES)}"
            )
        self.camera = camera = options.camera
        self.sparse = options.sparse
        self.images = spec.observation.images
        self.state_dim = schema.state_dim
        self.fast = spec.fast_render
        self.terminate_on_success = options.terminate_on_success
        size = self.size = schema.cameras[camera].height
        self.benchmark = metaworld.MT1(task, seed=0)  # type: ignore[no-untyped-call]  # untyped
        self.env: Any = self.benchmark.train_classes[task](
            render_mode="rgb_array", camera_name=camera, width=size, height=size
        )
        if spec.max_episode_steps is not None:
            self.env.max_path_length = spec.max_episode_steps
        if self.fast:
            mujoco_fast_render(self.env.model)
        self.tasks = list(self.benchmark.train_tasks)
        self.rng = np.random.default_rng()
        # The last full 39-D observation, whatever the tenant observes: a scripted
        # expert reads the goal and object poses from it when the tenant sees only
        # proprioception (recording demonstrations for SFT from pixels).
        self.full_state = np.zeros(0, np.float64)

    def _obs(self, state: np.ndarray) -> SingleObservation:
        self.full_state = np.asarray(state, dtype=np.float64)
        if self.images:
            frame = mujoco_render_rgb(self.env, fast=self.fast)
            if self.camera in _UPSIDE_DOWN:
                frame = np.ascontiguousarray(frame[::-1, ::-1])
        else:  # nothing rendered: the camera slot carries a constant frame
            frame = np.zeros((self.size, self.size, 3), np.uint8)
        return SingleObservation(
            cameras={self.camera: frame},
            state=np.asarray(state, dtype=np.float32)[: self.state_dim],
        )

    def reset(self, seed: int | None) -> SingleObservation:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.env.set_task(self.tasks[int(self.rng.integers(len(self.tasks)))])
        state, _ = self.env.reset()
        return self._obs(state)

    def step(self, action: np.ndarray) -> SingleStep:
        clipped = np.clip(action, -1.0, 1.0)
        state, reward, terminated, truncated, info = self.env.step(clipped)
        success = bool(info.get("success", 0.0))
        return SingleStep(
            observation=self._obs(state),
            reward=float(success) if self.sparse else float(reward),
            terminated=bool(terminated or (success and self.terminate_on_success)),
            truncated=bool(truncated),
            success=success,
            info={"near_object": float(info.get("near_object", 0.0))},
        )

    def close(self) -> None:
        self.env.close()


def full_states(env: EnvAdapter) -> np.ndarray | None:
    """The sub-envs' last full 39-D observations ``[N, 39]`` (privileged: goal and
    object poses), or None when ``env`` is not a MetaWorld adapter of this process."""
    subs = getattr(env, "envs", None)
    if not subs or not all(isinstance(e, _MetaWorldSingle) for e in subs):
        return None
    return np.stack([e.full_state for e in subs])


def make_metaworld(spec: EnvSpec) -> EnvAdapter:
    """Build a (possibly vectorized) MetaWorld MT1 adapter from ``spec``."""
    schema = metaworld_schema(spec)
    options = _options(spec)
    envs: list[SingleEnv] = [_MetaWorldSingle(spec, schema, options) for _ in range(spec.num_envs)]
    return VectorEnvAdapter(envs, schema)


register_env(
    "metaworld",
    "joynexus.envs.metaworld:make_metaworld",
    schema="joynexus.envs.metaworld:metaworld_schema",
    description="MetaWorld MT1 tasks (e.g. reach-v3) with one camera, state 39, action 4",
    requires=["metaworld", "mujoco"],
    states=("default", "proprio", "privileged"),
    images_optional=True,
)
