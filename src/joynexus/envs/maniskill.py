"""ManiSkill3 adapter: tabletop tasks on the CPU simulation backend with RGB cameras.

Supported tasks are those whose assets ship with ``mani-skill`` (others download assets
and prompt on stdin): see :data:`TASKS`. Each sub-env is one ManiSkill env with
``sim_backend="cpu"``; rendering goes through SAPIEN's Vulkan renderer, which on a machine
without a GPU needs Mesa ≥ 24.3's software Vulkan driver (``scripts/install-system-deps.sh``
installs it).

What a tenant sees: the task's sensor cameras (``base_camera``; StackCube also
``hand_camera``) rendered directly at ``image_size`` (default 128); state = the Panda's
joint positions (9) and velocities (9) followed by the task's "extra" observations in
ManiSkill's order (e.g. PickCube: is_grasped, tcp_pose, goal_pos — the goal is not visible
to the cameras); actions in the chosen controller's space, clipped to [-1, 1].
``success`` is ManiSkill's ``info["success"]``, which also terminates the episode.

Options:
    control_mode (str, default ``"pd_ee_delta_pose"``): one of :data:`CONTROL_MODES`. The
        default is a 7-D end-effector delta + gripper action like LIBERO's.
    reward_mode (str, default ``"normalized_dense"``): ``sparse``, ``dense``,
        ``normalized_dense`` or ``none``.

``fast_render`` (default on) uses ManiSkill's ``minimal`` shader for the cameras; off
uses the ``default`` shader pack (lighting and shadows; ~15 % slower on software Vulkan).

Observation choices (``EnvSpec.observation``): ``state`` ``default`` is the above,
``proprio`` the Panda's joints only (18), ``privileged`` ManiSkill's ``state``
observation (joints plus every extra, the objects' poses included: PickCube 42,
PushCube 35, PullCube 35, StackCube 48). ``images: false`` renders nothing (the
simulator runs with ``obs_mode="state_dict"``; a black frame fills each camera), about
5× cheaper per step on a CPU; ``privileged`` needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from joynexus.envs.base import EnvAdapter, EnvSpec
from joynexus.envs.registry import register_env
from joynexus.envs.render import resize_image
from joynexus.envs.vector import SingleEnv, SingleObservation, SingleStep, VectorEnvAdapter
from joynexus.errors import SpecError
from joynexus.models.schema import CameraSpec, DataSchema

__all__ = [
    "CONTROL_MODES",
    "DEFAULT_IMAGE_SIZE",
    "TASKS",
    "ManiSkillTask",
    "make_maniskill",
    "maniskill_schema",
]

DEFAULT_IMAGE_SIZE = 128
# Panda joint positions and velocities (7 arm joints + 2 fingers each).
_AGENT_STATE_DIM = 18
_REWARD_MODES = ("sparse", "dense", "normalized_dense", "none")
_OPTIONS = {"control_mode", "reward_mode"}


@dataclass(frozen=True)
class ManiSkillTask:
    """A supported ManiSkill task: its cameras, extra state and instruction.

    Attributes:
        extra_keys: The extra observations ManiSkill gives with ``obs_mode="rgb"``
            (the ``default`` state), in its order.
        extra_dim: Their total size.
        privileged_extra_dim: The size of every extra of ``obs_mode="state_dict"``.
    """

    cameras: tuple[str, ...]
    extra_keys: tuple[str, ...]
    extra_dim: int
    privileged_extra_dim: int
    instruction: str


# Extra-state sizes as ManiSkill 3.0 reports them (a test checks them).
TASKS: dict[str, ManiSkillTask] = {
    "PickCube-v1": ManiSkillTask(
        ("base_camera",),
        ("is_grasped", "tcp_pose", "goal_pos"),
        11,
        24,
        "pick up the red cube and move it to the goal position",
    ),
    "PushCube-v1": ManiSkillTask(
        ("base_camera",), ("tcp_pose",), 7, 17, "push the cube onto the target"
    ),
    "PullCube-v1": ManiSkillTask(
        ("base_camera",), ("tcp_pose", "goal_pos"), 10, 17, "pull the cube onto the target"
    ),
    "StackCube-v1": ManiSkillTask(
        ("base_camera", "hand_camera"),
        ("tcp_pose",),
        7,
        30,
        "stack the red cube on top of the green cube",
    ),
}
CONTROL_MODES: dict[str, int] = {
    "pd_ee_delta_pose": 7,
    "pd_ee_delta_pos": 4,
    "pd_joint_delta_pos": 8,
    "pd_joint_pos": 8,
}


def _task(spec: EnvSpec) -> tuple[str, ManiSkillTask]:
    if not spec.task or spec.task not in TASKS:
        raise SpecError(
            f"maniskill task {spec.task!r} is not supported; use one of {sorted(TASKS)} "
            "(their assets ship with mani-skill)"
        )
    return spec.task, TASKS[spec.task]


def _options(spec: EnvSpec) -> tuple[str, str]:
    unknown = set(spec.options) - _OPTIONS
    if unknown:
        raise SpecError(
            f"unknown maniskill option(s) {sorted(unknown)}; allowed: {sorted(_OPTIONS)}"
        )
    control_mode = str(spec.options.get("control_mode", "pd_ee_delta_pose"))
    if control_mode not in CONTROL_MODES:
        raise SpecError(
            f"maniskill control_mode {control_mode!r} is not one of {sorted(CONTROL_MODES)}"
        )
    reward_mode = str(spec.options.get("reward_mode", "normalized_dense"))
    if reward_mode not in _REWARD_MODES:
        raise SpecError(f"maniskill reward_mode {reward_mode!r} is not one of {_REWARD_MODES}")
    return control_mode, reward_mode


def maniskill_schema(spec: EnvSpec) -> DataSchema:
    """The schema of a ManiSkill task (starts no simulator)."""
    name, task = _task(spec)
    control_mode, _ = _options(spec)
    size = spec.image_size or DEFAULT_IMAGE_SIZE
    return DataSchema(
        name=f"maniskill-{name.lower()}",
        cameras={cam: CameraSpec(height=size, width=size) for cam in task.cameras},
        state_dim=_AGENT_STATE_DIM + _extra_dim(spec, task),
        action_dim=CONTROL_MODES[control_mode],
        action_chunk=8,
        fps=20.0,
        instruction=task.instruction,
    )


def _extra_dim(spec: EnvSpec, task: ManiSkillTask) -> int:
    choice = spec.observation.state
    if choice == "privileged" and spec.observation.images:
        raise SpecError(
            "maniskill observation.state 'privileged' is ManiSkill's state observation, "
            "which renders no camera: set observation.images to false",
            field="env.observation",
        )
    if choice == "proprio":
        return 0
    return task.privileged_extra_dim if choice == "privileged" else task.extra_dim


def _flatten(tree: Any) -> list[np.ndarray]:
    # ManiSkill's dict observations keep insertion order; flatten depth-first in that order.
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in _flatten(value)]
    arr = np.asarray(tree.cpu().numpy() if hasattr(tree, "cpu") else tree, dtype=np.float32)
    return [arr.reshape(arr.shape[0], -1)]


def _scalar(value: Any) -> float:
    return float(value.item() if hasattr(value, "item") else value)


class _ManiSkillSingle:
    def __init__(self, spec: EnvSpec, schema: DataSchema, control_mode: str, reward_mode: str):
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  # registers the ManiSkill env ids

        name, task = _task(spec)
        self.cameras = task.cameras
        self.size = schema.cameras[task.cameras[0]].height
        self.state_dim = schema.state_dim
        self.images = spec.observation.images
        # Which extras the state holds: none (proprio), the rgb-mode ones, or all.
        choice = spec.observation.state
        self.extra_keys: tuple[str, ...] | None = (
            () if choice == "proprio" else None if choice == "privileged" else task.extra_keys
        )
        kwargs: dict[str, Any] = {}
        if spec.max_episode_steps is not None:
            kwargs["max_episode_steps"] = spec.max_episode_steps
        if self.images:
            kwargs["sensor_configs"] = {
                "width": self.size,
                "height": self.size,
                "shader_pack": "minimal" if spec.fast_render else "default",
            }
        self.env: Any = gym.make(
            name,
            obs_mode="rgb" if self.images else "state_dict",
            num_envs=1,
            sim_backend="cpu",
            render_backend="cpu",
            control_mode=control_mode,
            reward_mode=reward_mode,
            **kwargs,
        )

    def _obs(self, raw: dict[str, Any]) -> SingleObservation:
        cameras = {}
        for cam in self.cameras:
            if not self.images:  # nothing rendered: the camera slot carries a constant frame
                cameras[cam] = np.zeros((self.size, self.size, 3), np.uint8)
                continue
            rgb = raw["sensor_data"][cam]["rgb"]
            frame = np.asarray(rgb.cpu().numpy() if hasattr(rgb, "cpu") else rgb)[0]
            cameras[cam] = resize_image(frame[..., :3].astype(np.uint8), self.size, self.size)
        extra = raw.get("extra", {})
        if self.extra_keys is not None:
            extra = {k: extra[k] for k in self.extra_keys}
        state = np.concatenate(_flatten(raw["agent"]) + _flatten(extra), axis=1)[0]
        if state.shape[0] != self.state_dim:
            raise SpecError(
                f"ManiSkill returned a state of {state.shape[0]} values, expected "
                f"{self.state_dim}; this mani-skill version is not the one the adapter knows"
            )
        return SingleObservation(cameras=cameras, state=state)

    def reset(self, seed: int | None) -> SingleObservation:
        raw, _ = self.env.reset(seed=seed)
        return self._obs(raw)

    def step(self, action: np.ndarray) -> SingleStep:
        clipped = np.clip(action, -1.0, 1.0).astype(np.float32)[None]
        raw, reward, terminated, truncated, info = self.env.step(clipped)
        success = bool(_scalar(info.get("success", False)))
        return SingleStep(
            observation=self._obs(raw),
            reward=_scalar(reward),
            terminated=bool(_scalar(terminated)),
            truncated=bool(_scalar(truncated)),
            success=success,
        )

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            env.close()


def make_maniskill(spec: EnvSpec) -> EnvAdapter:
    """Build a (possibly vectorized) ManiSkill3 adapter from ``spec``.

    Raises:
        SpecError: Unsupported task or option.
    """
    schema = maniskill_schema(spec)
    control_mode, reward_mode = _options(spec)
    envs: list[SingleEnv] = [
        _ManiSkillSingle(spec, schema, control_mode, reward_mode) for _ in range(spec.num_envs)
    ]
    return VectorEnvAdapter(envs, schema)


register_env(
    "maniskill",
    "joynexus.envs.maniskill:make_maniskill",
    schema="joynexus.envs.maniskill:maniskill_schema",
    description="ManiSkill3 tabletop tasks (PickCube-v1, PushCube-v1, ...) on the CPU backend",
    requires=["mani_skill", "sapien", "gymnasium"],
    states=("default", "proprio", "privileged"),
    images_optional=True,
)
