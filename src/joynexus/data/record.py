"""Record expert demonstrations from a simulator into a LeRobot v3.0 dataset.

``joynexus data record --env pusht --policy scripted --episodes 50 --out DIR`` runs
:func:`record_episodes`: an env adapter (:mod:`joynexus.envs`) is stepped by a scripted
expert and every transition becomes one frame with LeRobot's usual keys::

    observation.images.<camera>   video (or image with use_videos=False)
    observation.state             float32 [state_dim]
    action                        float32 [action_dim]
    next.reward / next.done / next.success

:func:`record_missing_dataset` does the same for a workload spec whose
``dataset.record_episodes`` asks for a dataset that does not exist yet.

Experts: MetaWorld ships one scripted policy per task (``metaworld.policies``); PushT
gets :class:`PushTScriptedPolicy`, a pusher controller driven by the T block's pose.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from joynexus.data.lerobot_format import FeatureSpec
from joynexus.data.writer import LeRobotDatasetWriter
from joynexus.envs.base import EnvAdapter, EnvObservation, EnvSpec
from joynexus.envs.registry import make_env
from joynexus.errors import SpecError
from joynexus.models.schema import DataSchema

if TYPE_CHECKING:  # only read here; importing it at run time would load the model layer
    from joynexus.spec.workload import WorkloadSpec

__all__ = [
    "MetaWorldScriptedPolicy",
    "PushTScriptedPolicy",
    "RecordSummary",
    "ScriptedPolicy",
    "dataset_features",
    "make_scripted_policy",
    "record_episodes",
    "record_missing_dataset",
]


class ScriptedPolicy(Protocol):
    """An expert that acts on a live env (it may read privileged simulator state)."""

    def reset(self) -> None: ...

    def act(self, env: EnvAdapter, obs: EnvObservation) -> np.ndarray:
        """float32 ``[num_envs, action_dim]`` for the current observation."""
        ...


def _gym_envs(env: EnvAdapter) -> list[Any]:
    """The unwrapped gymnasium envs behind a local adapter (for privileged state)."""
    subs = getattr(env, "envs", None)
    if not subs:
        raise SpecError(
            "the scripted expert needs a local simulator adapter (it reads the simulator's "
            "internal state); this env does not expose its sub-envs"
        )
    out = []
    for sub in subs:
        gym_env = getattr(sub, "env", None)
        if gym_env is None:
            raise SpecError("the scripted expert cannot reach this adapter's simulator")
        out.append(getattr(gym_env, "unwrapped", gym_env))
    return out


def _rot90(v: np.ndarray) -> np.ndarray:
    return np.array([-v[1], v[0]])


def _wrap(angle: float) -> float:
    return (angle + math.pi) % (2 * math.pi) - math.pi


class PushTScriptedPolicy:
    """Pushes the T block toward its goal pose using the block's true pose.

    Translation first: the pusher goes behind the block (relative to the goal
    direction), walking around it when it starts on the wrong side, then pushes
    through the block's centre of mass; a lateral offset of the contact point turns
    the block toward the goal angle on the way. Once the block is near the goal it
    only rotates it by pushing tangentially at a lever arm. Not optimal, but it
    raises coverage on most seeds.

    Args:
        behind: Distance (px) behind the centre of mass where a push starts.
        max_step: Largest pusher displacement per action (the env's PD controller
            overshoots with larger jumps).
    """

    def __init__(self, behind: float = 75.0, max_step: float = 40.0) -> None:
        self.behind = behind
        self.max_step = max_step

    def reset(self) -> None:
        """Stateless: the pose is read every step."""

    def act(self, env: EnvAdapter, obs: EnvObservation) -> np.ndarray:
        actions = []
        for i, sim in enumerate(_gym_envs(env)):
            block, goal = sim.block, np.asarray(sim.goal_pose, dtype=np.float64)
            com = np.asarray(block.local_to_world(block.center_of_gravity), dtype=np.float64)
            # The goal pose is the body origin's; steer the centre of mass to where it
            # sits when the block is at that pose.
            c, s = math.cos(goal[2]), math.sin(goal[2])
            cog = np.asarray(block.center_of_gravity, dtype=np.float64)
            goal_com = goal[:2] + np.array([c * cog[0] - s * cog[1], s * cog[0] + c * cog[1]])
            agent = np.asarray(obs.state[i], dtype=np.float64)
            target = np.array([goal_com[0], goal_com[1], goal[2]])
            actions.append(self._control(agent, com, float(block.angle), target))
        return np.asarray(actions, dtype=np.float32)

    def _control(
        self, agent: np.ndarray, com: np.ndarray, angle: float, goal: np.ndarray
    ) -> np.ndarray:
        err = goal[:2] - com
        dist = float(np.linalg.norm(err))
        ang_err = _wrap(float(goal[2]) - angle)
        rel = agent - com
        if dist > 12.0:
            d = err / dist
            perp = _rot90(d)
            # Pushing at +perp of the centre gives negative torque (r x F = -s): steer
            # the block's angle toward the goal while translating.
            offset = -float(np.clip(25.0 * ang_err, -25.0, 25.0))
            along, lateral = float(rel @ d), float(rel @ perp)
            if along < -30.0 and abs(lateral - offset) < 25.0:
                # Behind the block (possibly touching it): push through, fixing the lateral.
                target = agent + d * self.max_step + perp * 0.5 * (offset - lateral)
            elif along > -0.5 * self.behind:
                # On the goal side of the block: walk around it, not through it.
                side = 1.0 if lateral >= 0 else -1.0
                target = com + perp * side * (self.behind + 30.0) - d * self.behind
            else:
                target = com - d * self.behind + perp * offset
        else:
            if abs(ang_err) < 0.05:
                hold: np.ndarray = np.clip(agent, 0.0, 512.0).astype(np.float32)
                return hold
            u = rel / (np.linalg.norm(rel) + 1e-9)
            tangent = math.copysign(1.0, ang_err) * _rot90(u)  # r x F > 0 for F = rot90(r)
            if float(np.linalg.norm(rel)) < 80.0:
                target = agent + tangent * 30.0 - u * 10.0
            else:
                target = com + u * 60.0
        step = target - agent
        n = float(np.linalg.norm(step))
        if n > self.max_step:
            step = step * (self.max_step / n)
        action: np.ndarray = np.clip(agent + step, 0.0, 512.0).astype(np.float32)
        return action


class MetaWorldScriptedPolicy:
    """MetaWorld's shipped expert for ``task`` (``metaworld.policies.ENV_POLICY_MAP``),
    applied to each sub-env's 39-D state."""

    def __init__(self, task: str) -> None:
        from metaworld.policies import ENV_POLICY_MAP

        if task not in ENV_POLICY_MAP:
            raise SpecError(
                f"MetaWorld ships no scripted policy for {task!r}; known: "
                f"{', '.join(sorted(ENV_POLICY_MAP))}"
            )
        # The map is typed with the abstract base class; its values are concrete experts.
        expert_cls: Any = ENV_POLICY_MAP[task]
        self._policy = expert_cls()

    def reset(self) -> None:
        """MetaWorld experts are stateless."""

    def act(self, env: EnvAdapter, obs: EnvObservation) -> np.ndarray:
        rows = [self._policy.get_action(np.asarray(s, dtype=np.float64)) for s in obs.state]
        return np.clip(np.asarray(rows, dtype=np.float32), -1.0, 1.0)


def make_scripted_policy(spec: EnvSpec) -> ScriptedPolicy:
    """The scripted expert for an env kind.

    Raises:
        SpecError: the kind has no scripted expert.
    """
    if spec.kind == "pusht":
        return PushTScriptedPolicy()
    if spec.kind == "metaworld":
        if not spec.task:
            raise SpecError("metaworld recording needs a task, e.g. --task reach-v3")
        return MetaWorldScriptedPolicy(spec.task)
    if spec.kind == "reach2d":
        from joynexus.envs.reach2d import Reach2DScriptedPolicy, reach2d_schema

        reach2d_schema(spec)  # validates the task and options before recording
        speed = spec.options.get("max_speed")
        # The expert must know the env's speed to slow down exactly onto the goal.
        return Reach2DScriptedPolicy() if speed is None else Reach2DScriptedPolicy(float(speed))
    raise SpecError(
        f"no scripted expert for env kind {spec.kind!r}; scripted experts exist for "
        "'pusht', 'metaworld' and 'reach2d'"
    )


def dataset_features(schema: DataSchema, *, use_videos: bool = True) -> dict[str, FeatureSpec]:
    """LeRobot features for demonstrations recorded in ``schema``."""
    feats: dict[str, FeatureSpec] = {}
    for name, cam in schema.cameras.items():
        feats[f"observation.images.{name}"] = FeatureSpec(
            dtype="video" if use_videos else "image",
            shape=cam.shape,
            names=["height", "width", "channels"],
        )
    feats["observation.state"] = FeatureSpec(
        dtype="float32", shape=(max(schema.state_dim, 1),), names=None
    )
    feats["action"] = FeatureSpec(dtype="float32", shape=(schema.action_dim,), names=None)
    feats["next.reward"] = FeatureSpec(dtype="float32", shape=(1,), names=None)
    feats["next.done"] = FeatureSpec(dtype="bool", shape=(1,), names=None)
    feats["next.success"] = FeatureSpec(dtype="bool", shape=(1,), names=None)
    return feats


@dataclass(frozen=True)
class RecordSummary:
    """What :func:`record_episodes` wrote."""

    root: Path
    episodes: int
    frames: int
    successes: int

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


def record_episodes(
    spec: EnvSpec,
    out: str | Path,
    *,
    episodes: int,
    policy: str = "scripted",
    seed: int = 0,
    max_steps: int | None = None,
    use_videos: bool = True,
    repo_id: str | None = None,
    on_episode: Callable[[int, int, bool], None] | None = None,
) -> RecordSummary:
    """Roll out the expert for ``episodes`` episodes and write them to ``out``.

    Args:
        spec: The env to record (``num_envs`` is forced to 1).
        out: Dataset directory to create (must not exist).
        episodes: Number of episodes.
        policy: Only ``"scripted"``.
        seed: Episode ``k`` resets with ``seed + k``.
        max_steps: Cut each episode after this many steps (default: the env's limit,
            ``spec.max_episode_steps``, else 300).
        use_videos: Cameras as mp4 videos (else PNG images in parquet).
        repo_id: Dataset id for ``info.json`` (default ``local/<kind>_scripted``).
        on_episode: Called as ``(episode_index, length, success)`` after each episode.

    Raises:
        SpecError: unknown policy or env kind without an expert.
    """
    if policy != "scripted":
        raise SpecError(f"unknown policy {policy!r}; only 'scripted' is available")
    if episodes <= 0:
        raise SpecError(f"episodes must be positive, got {episodes}")
    limit = max_steps or spec.max_episode_steps or 300
    spec = spec.model_copy(update={"num_envs": 1, "max_episode_steps": limit})
    expert = make_scripted_policy(spec)
    env = make_env(spec)
    schema = env.schema
    frames = successes = 0
    writer = LeRobotDatasetWriter.create(
        out,
        repo_id=repo_id or f"local/{spec.kind}_scripted",
        fps=max(1, round(schema.fps)),
        features=dataset_features(schema, use_videos=use_videos),
        robot_type=spec.kind,
        use_videos=use_videos,
    )
    try:
        with writer:
            for ep in range(episodes):
                expert.reset()
                obs = env.reset(seed=seed + ep)
                task = obs.instruction or schema.instruction or spec.kind
                success = False
                for t in range(limit):
                    action = expert.act(env, obs)
                    step = env.step(action)
                    done = bool(step.terminated[0] or step.truncated[0]) or t == limit - 1
                    success = success or bool(step.success[0])
                    frame: dict[str, Any] = {
                        f"observation.images.{c}": obs.cameras[c][0] for c in schema.cameras
                    }
                    state = obs.state[0] if schema.state_dim else np.zeros(1, np.float32)
                    frame["observation.state"] = np.asarray(state, np.float32)
                    frame["action"] = action[0]
                    frame["next.reward"] = np.float32(step.reward[0])
                    frame["next.done"] = done
                    frame["next.success"] = bool(step.success[0])
                    writer.add_frame(frame, task=task)
                    obs = step.observation
                    if done:
                        break
                length = writer.episode_buffer_size
                writer.save_episode()
                frames += length
                successes += int(success)
                if on_episode is not None:
                    on_episode(ep, length, success)
    finally:
        env.close()
    return RecordSummary(root=Path(out), episodes=episodes, frames=frames, successes=successes)


def record_missing_dataset(
    spec: WorkloadSpec, on_episode: Callable[[int, int, bool], None] | None = None
) -> Path:
    """Record ``spec.dataset.record_episodes`` expert episodes into the missing dataset.

    Returns:
        The dataset directory (``spec.dataset.path``).
    """
    assert spec.dataset is not None and spec.env is not None
    summary = record_episodes(
        spec.env,
        spec.dataset.path,
        episodes=spec.dataset.record_episodes,
        seed=spec.seed,
        on_episode=on_episode,
    )
    return summary.root
