"""LIBERO adapter (``hf-libero`` on robosuite/MuJoCo), in the LeRobot LIBERO data layout.

Task names are ``"<suite>/<task>"`` where ``<task>`` is the task's index in the suite or its
name, e.g. ``"libero_spatial/0"`` or ``"libero_goal/open_the_middle_drawer_of_the_cabinet"``.

What a tenant sees (the :data:`~joynexus.models.schema.LIBERO` schema): cameras ``image``
(agent view) and ``wrist_image`` (eye in hand), rotated by 180° as in the LeRobot LIBERO
datasets (MuJoCo renders them upside down); state 8 = end-effector position (3), its
orientation as an axis-angle vector (3) and the two gripper finger positions; actions 7 =
OSC_POSE deltas (6) and gripper (-1 open, +1 close), clipped to [-1, 1]. Reward is LIBERO's
sparse 1.0 on success; success terminates the episode. The state is the robot's own
(no object pose), so ``observation.state`` ``proprio`` is the same as ``default``.
Episodes are truncated after ``max_episode_steps`` (default: the step budgets commonly
used to evaluate each suite).

Options:
    init_state_index (int | None): use the benchmark's fixed initial states (evaluation).
        Sub-env ``i``'s ``k``-th episode since the last ``reset`` starts from state
        ``(init_state_index + i + k * num_envs) mod 50``, so ``N`` sub-envs together walk
        through consecutive states (a grouped reset walks per group, see
        :class:`LiberoAdapter`). ``None`` (default) samples object placements at
        random, seeded by ``reset(seed=...)``.
    settle_steps (int, default 0): no-op steps after a reset so objects come to rest (many
        evaluation scripts use 10); they are not counted as episode steps.
    hard_reset (bool, default False): rebuild the MuJoCo model on every reset as robosuite
        does by default. Off is ~8× faster and safe here: every reset restores the full
        simulator state (sampled placements or a fixed init state).
    flip_images (bool, default True): rotate camera images by 180° (see above).
    cameras (list, default ``["image", "wrist_image"]``): the cameras the tenant reads;
        only these are rendered. Rendering is most of a step on a software renderer
        and costs per camera, not per pixel (docs/RESULTS.md §14.1): a tenant that
        reads the agent view alone steps about 1.6 times as fast.

``fast_render`` turns off shadows, reflections and multisampling in robosuite's offscreen
renderer (software rendering spends most of a step there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from joynexus.envs.base import EnvAdapter, EnvObservation, EnvSpec, check_group_size
from joynexus.envs.registry import register_env
from joynexus.envs.render import ensure_headless_gl, resize_image
from joynexus.envs.vector import SingleEnv, SingleObservation, SingleStep, VectorEnvAdapter
from joynexus.errors import SpecError
from joynexus.models.schema import LIBERO, CameraSpec, DataSchema

__all__ = [
    "DEFAULT_IMAGE_SIZE",
    "SUITE_MAX_STEPS",
    "SUITE_TASKS",
    "LiberoTask",
    "expand_suite_tasks",
    "libero_schema",
    "make_libero",
    "quat_to_axis_angle",
    "resolve_task",
]

DEFAULT_IMAGE_SIZE = 256
# Episode budgets commonly used when evaluating each suite (longest demo plus a margin).
SUITE_MAX_STEPS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
#: Tasks per suite (hf-libero's benchmark; fixed, so specs expand without importing it).
SUITE_TASKS = {
    "libero_spatial": 10,
    "libero_object": 10,
    "libero_goal": 10,
    "libero_10": 10,
    "libero_90": 90,
}
_CAMERAS = {"image": "agentview", "wrist_image": "robot0_eye_in_hand"}
_OPTIONS = {"init_state_index", "settle_steps", "hard_reset", "flip_images", "cameras"}
# Gripper open, arm still: what evaluation scripts send while objects settle.
_NOOP_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)


@dataclass(frozen=True)
class _Options:
    init_state_index: int | None
    settle_steps: int
    hard_reset: bool
    flip_images: bool
    cameras: tuple[str, ...]


@dataclass(frozen=True)
class LiberoTask:
    """A resolved LIBERO task."""

    suite: str
    index: int
    name: str
    language: str
    bddl_file: str


def _options(spec: EnvSpec) -> _Options:
    unknown = set(spec.options) - _OPTIONS
    if unknown:
        raise SpecError(f"unknown libero option(s) {sorted(unknown)}; allowed: {sorted(_OPTIONS)}")
    raw_index = spec.options.get("init_state_index")
    if raw_index is not None and (not isinstance(raw_index, int) or raw_index < 0):
        raise SpecError(f"libero init_state_index must be a non-negative int, got {raw_index!r}")
    settle = spec.options.get("settle_steps", 0)
    if not isinstance(settle, int) or settle < 0:
        raise SpecError(f"libero settle_steps must be a non-negative int, got {settle!r}")
    cameras = spec.options.get("cameras", list(_CAMERAS))
    if (
        not isinstance(cameras, list)
        or not cameras
        or any(c not in _CAMERAS for c in cameras)
        or len(set(cameras)) != len(cameras)
    ):
        raise SpecError(
            f"libero cameras must be a non-empty list of distinct names from {list(_CAMERAS)}, "
            f"got {cameras!r}"
        )
    return _Options(
        init_state_index=raw_index,
        settle_steps=settle,
        hard_reset=bool(spec.options.get("hard_reset", False)),
        flip_images=bool(spec.options.get("flip_images", True)),
        cameras=tuple(cameras),
    )


def _split_task(spec: EnvSpec) -> tuple[str, str]:
    suite, sep, task = (spec.task or "").partition("/")
    if not sep or not suite or not task:
        raise SpecError(
            "libero needs task='<suite>/<task index or name>', e.g. 'libero_spatial/0'; "
            f"got {spec.task!r}"
        )
    if suite not in SUITE_MAX_STEPS:
        raise SpecError(f"unknown LIBERO suite {suite!r}; known: {sorted(SUITE_MAX_STEPS)}")
    if task.isdigit() and int(task) >= SUITE_TASKS[suite]:
        raise SpecError(
            f"LIBERO suite {suite!r} has {SUITE_TASKS[suite]} tasks; index {task} is out"
        )
    return suite, task


def expand_suite_tasks(task: str) -> list[str]:
    """``"<suite>/*"`` -> every task of the suite (``"<suite>/0"`` ...); others as given.

    Raises:
        SpecError: an unknown suite.
    """
    suite, sep, rest = task.partition("/")
    if not sep or rest != "*":
        return [task]
    if suite not in SUITE_TASKS:
        raise SpecError(f"unknown LIBERO suite {suite!r}; known: {sorted(SUITE_TASKS)}")
    return [f"{suite}/{i}" for i in range(SUITE_TASKS[suite])]


def quat_to_axis_angle(quat_xyzw: np.ndarray) -> np.ndarray:
    """Axis-angle vector (axis × angle, radians) of a unit quaternion in xyzw order."""
    q = np.asarray(quat_xyzw, dtype=np.float64)
    w = float(np.clip(q[3], -1.0, 1.0))
    sin_half = float(np.sqrt(max(1.0 - w * w, 0.0)))
    if sin_half < 1e-8:
        return np.zeros(3, dtype=np.float64)
    axis_angle: np.ndarray = q[:3] * (2.0 * np.arccos(w) / sin_half)
    return axis_angle


def libero_schema(spec: EnvSpec) -> DataSchema:
    """The LIBERO schema at ``spec.image_size`` (default 256), with the task's instruction.

    The instruction is the task name with spaces; :func:`make_libero` serves the BDDL
    file's own instruction, which reads the same for the packaged suites.
    """
    opts = _options(spec)
    _, task = _split_task(spec)
    size = spec.image_size or DEFAULT_IMAGE_SIZE
    instruction = "" if task.isdigit() else task.replace("_", " ")
    return LIBERO.model_copy(
        update={
            "cameras": {name: CameraSpec(height=size, width=size) for name in opts.cameras},
            "instruction": instruction,
        }
    )


def resolve_task(suite: str, task: str) -> LiberoTask:
    """Look a task up in a suite of the configured benchmark (after :func:`prepare_libero`).

    Raises:
        SpecError: The task index or name is not in the suite.
    """
    import os

    from libero.libero import benchmark, get_libero_path

    tasks = benchmark.get_benchmark_dict()[suite]()
    names: list[str] = list(tasks.get_task_names())
    if task.isdigit():
        index = int(task)
        if index >= len(names):
            raise SpecError(f"LIBERO suite {suite!r} has {len(names)} tasks; index {index} is out")
    elif task in names:
        index = names.index(task)
    else:
        raise SpecError(f"LIBERO suite {suite!r} has no task {task!r}; tasks: {names}")
    info = tasks.get_task(index)
    bddl = os.path.join(get_libero_path("bddl_files"), info.problem_folder, info.bddl_file)
    if not os.path.isfile(bddl):
        raise SpecError(
            f"LIBERO task {suite}/{info.name} has no BDDL file at {bddl}: the asset pack in "
            "use lacks this suite; install the project's simulator extras (they hold every "
            "suite) or point $JOYNEXUS_LIBERO_ASSETS at a pack that has it"
        )
    return LiberoTask(suite, index, str(info.name), str(info.language), bddl)


class _LiberoSingle:
    def __init__(self, spec: EnvSpec, schema: DataSchema, opts: _Options, slot: int) -> None:
        ensure_headless_gl()
        from joynexus.envs.libero_setup import prepare_libero

        suite, task = _split_task(spec)
        prepare_libero(suite=suite)
        from libero.libero import benchmark
        from libero.libero.envs import OffScreenRenderEnv

        self.task = resolve_task(suite, task)
        self.size = schema.cameras["image"].height
        self.opts = opts
        self.fast = spec.fast_render
        # Where this sub-env walks through the fixed init states: state
        # ``init_state_index + slot + episode * stride`` (a grouped reset gives every
        # sub-env of a group the group's slot and strides by the number of groups).
        self.slot = slot
        self.stride = spec.num_envs
        self.episode = 0
        self.init_states: np.ndarray | None = None
        if opts.init_state_index is not None:
            tasks = benchmark.get_benchmark_dict()[suite]()
            self.init_states = np.asarray(tasks.get_task_init_states(self.task.index))
        self.env: Any = OffScreenRenderEnv(
            bddl_file_name=self.task.bddl_file,
            camera_names=[_CAMERAS[name] for name in opts.cameras],
            camera_heights=self.size,
            camera_widths=self.size,
            hard_reset=opts.hard_reset,
            # JoyNexus truncates episodes itself (max_episode_steps).
            ignore_done=True,
        )
        self._apply_fast_render()

    def _apply_fast_render(self) -> None:
        if not self.fast:
            return
        import mujoco

        ctx = self.env.sim._render_context_offscreen
        if ctx is None:
            return
        ctx.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        ctx.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        if ctx.con.offSamples != 0:
            # Multisampling is fixed when the framebuffer is made: rebuild it without.
            ctx.model._model.vis.quality.offsamples = 0
            ctx.gl_ctx.make_current()
            ctx.con.free()
            ctx._set_mujoco_context_and_buffers()

    def _obs(self, raw: dict[str, Any]) -> SingleObservation:
        cameras = {}
        for name in self.opts.cameras:
            robosuite_camera = _CAMERAS[name]
            frame = np.asarray(raw[f"{robosuite_camera}_image"], dtype=np.uint8)
            if self.opts.flip_images:
                frame = frame[::-1, ::-1]
            cameras[name] = resize_image(frame, self.size, self.size)
        state = np.concatenate(
            [
                raw["robot0_eef_pos"],
                quat_to_axis_angle(raw["robot0_eef_quat"]),
                raw["robot0_gripper_qpos"],
            ]
        ).astype(np.float32)
        return SingleObservation(cameras=cameras, state=state)

    def reset(self, seed: int | None) -> SingleObservation:
        if seed is not None:
            # LIBERO samples placements from numpy's global generator.
            self.env.seed(seed)
        raw = self.env.reset()
        self._apply_fast_render()  # a hard reset rebuilds the render context
        if self.init_states is not None and self.opts.init_state_index is not None:
            k = self.opts.init_state_index + self.slot + self.episode * self.stride
            raw = self.env.set_init_state(self.init_states[k % len(self.init_states)])
        self.episode += 1
        for _ in range(self.opts.settle_steps):
            raw, _, _, _ = self.env.step(_NOOP_ACTION)
        return self._obs(raw)

    def step(self, action: np.ndarray) -> SingleStep:
        clipped = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        raw, reward, _, _ = self.env.step(clipped)
        success = bool(self.env.check_success())
        return SingleStep(
            observation=self._obs(raw),
            reward=float(reward),
            terminated=success,
            truncated=False,
            success=success,
        )

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            env.close()


class LiberoAdapter(VectorEnvAdapter):
    """LIBERO sub-envs; ``reset(seed)`` restarts the walk through fixed init states.

    A grouped reset (``group_size`` G) walks per group: sub-env ``i``'s ``k``-th episode
    starts from state ``(init_state_index + i // G + k * num_envs / G) mod 50``.
    """

    def reset(self, seed: int | None = None, *, group_size: int = 1) -> EnvObservation:
        groups = check_group_size(self.num_envs, group_size)
        for i, env in enumerate(self.envs):
            if isinstance(env, _LiberoSingle):
                env.episode = 0
                env.slot, env.stride = i // group_size, groups
        return super().reset(seed, group_size=group_size)


def make_libero(spec: EnvSpec) -> EnvAdapter:
    """Build a (possibly vectorized) LIBERO adapter from ``spec``.

    Raises:
        SpecError: Bad task or options, or ``hf-libero`` missing.
    """
    schema = libero_schema(spec)
    opts = _options(spec)
    suite, _ = _split_task(spec)
    singles = [_LiberoSingle(spec, schema, opts, slot) for slot in range(spec.num_envs)]
    schema = schema.model_copy(update={"instruction": singles[0].task.language})
    envs: list[SingleEnv] = list(singles)
    max_steps = spec.max_episode_steps or SUITE_MAX_STEPS[suite]
    return LiberoAdapter(envs, schema, max_episode_steps=max_steps)


register_env(
    "libero",
    "joynexus.envs.libero:make_libero",
    schema="joynexus.envs.libero:libero_schema",
    description="LIBERO tasks ('libero_spatial/0'): 2 cameras, state 8, action 7 (hf-libero)",
    requires=["libero", "robosuite", "mujoco"],
    # LIBERO's state is the robot's own (end effector and gripper), never an object's
    # pose, so ``proprio`` names the same 8 values as ``default``.
    states=("default", "proprio"),
    # Scene assets come from no package registry: an asset pack or hf-libero's download.
    ready="joynexus.envs.libero_setup:assets_unavailable_reason",
)
