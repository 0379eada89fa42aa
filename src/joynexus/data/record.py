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
gets :class:`PushTScriptedPolicy` (:mod:`joynexus.data.pusht_expert`), which plans
pushes on a replica of the simulator;
ManiSkill3's PickCube, PushCube and StackCube get waypoint experts on the objects' true
poses (:mod:`joynexus.data.maniskill_expert`); LIBERO tasks whose goal puts one object
on another (every libero_spatial task, several libero_goal ones) get a pick-and-place
expert on the simulator's poses and collision geometry
(:mod:`joynexus.data.libero_expert`).
:class:`RecordSummary` reports the experts' success rate; ``joynexus data record``
refuses to keep a recording in which the expert never succeeded.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from joynexus.data.lerobot_format import FeatureSpec
from joynexus.data.pusht_expert import PushTScriptedPolicy
from joynexus.data.writer import LeRobotDatasetWriter
from joynexus.envs.base import EnvAdapter, EnvObservation, EnvSpec
from joynexus.envs.registry import make_env
from joynexus.errors import DatasetError, SpecError
from joynexus.models.schema import DataSchema

if TYPE_CHECKING:  # only read here; importing it at run time would load the model layer
    from joynexus.spec.workload import WorkloadSpec

__all__ = [
    "SCRIPTED_EXPERT_KINDS",
    "MetaWorldScriptedPolicy",
    "PushTScriptedPolicy",
    "RecordSummary",
    "ScriptedPolicy",
    "dataset_features",
    "make_scripted_policy",
    "record_episodes",
    "record_missing_dataset",
]

log = logging.getLogger(__name__)


class ScriptedPolicy(Protocol):
    """An expert that acts on a live env (it may read privileged simulator state)."""

    def reset(self) -> None: ...

    def act(self, env: EnvAdapter, obs: EnvObservation) -> np.ndarray:
        """float32 ``[num_envs, action_dim]`` for the current observation."""
        ...


_METAWORLD_FULL_STATE = 39


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
        from joynexus.envs.metaworld import full_states

        # The expert reads the goal and object poses; when the tenant observes only
        # proprioception (SFT from pixels) they come from the simulator, not the obs.
        states = obs.state if obs.state.shape[1] == _METAWORLD_FULL_STATE else full_states(env)
        if states is None or states.shape[1] != _METAWORLD_FULL_STATE:
            raise SpecError(
                "MetaWorld's scripted expert reads the full 39-D observation; record with "
                "observation.state 'default' or 'privileged', or from a local MetaWorld env"
            )
        rows = [self._policy.get_action(np.asarray(s, dtype=np.float64)) for s in states]
        return np.clip(np.asarray(rows, dtype=np.float32), -1.0, 1.0)


#: Env kinds :func:`make_scripted_policy` has an expert for.
SCRIPTED_EXPERT_KINDS = ("pusht", "metaworld", "maniskill", "reach2d", "libero")


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
    if spec.kind == "maniskill":
        from joynexus.data.maniskill_expert import ManiSkillScriptedPolicy

        return ManiSkillScriptedPolicy(spec)
    if spec.kind == "libero":
        from joynexus.data.libero_expert import LiberoScriptedPolicy

        return LiberoScriptedPolicy(spec)
    if spec.kind == "reach2d":
        from joynexus.envs.reach2d import Reach2DScriptedPolicy, reach2d_schema

        reach2d_schema(spec)  # validates the task and options before recording
        speed = spec.options.get("max_speed")
        # The expert must know the env's speed to slow down exactly onto the goal.
        return Reach2DScriptedPolicy() if speed is None else Reach2DScriptedPolicy(float(speed))
    raise SpecError(
        f"no scripted expert for env kind {spec.kind!r}; scripted experts exist for "
        f"{', '.join(SCRIPTED_EXPERT_KINDS)}"
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
    """What :func:`record_episodes` wrote.

    Attributes:
        root: The dataset directory.
        episodes: Episodes the expert ran (seeds ``seed .. seed + episodes - 1``).
        frames: Frames written.
        successes: Episodes in which the expert succeeded.
        kept: Episodes written (all of them, or the successful ones only).
    """

    root: Path
    episodes: int
    frames: int
    successes: int
    kept: int = -1

    def __post_init__(self) -> None:
        if self.kept < 0:  # every episode was written
            object.__setattr__(self, "kept", self.episodes)

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
    keep_failures: bool = False,
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
        keep_failures: Also write the episodes in which the expert did not succeed
            (default: only successful ones, like ``joynexus data record`` and a spec's
            ``dataset.record_failures``; the episode index counts attempts, so the
            seeds stay ``seed + k``).

    Raises:
        SpecError: unknown policy or env kind without an expert.
        DatasetError: ``keep_failures`` is False and no episode succeeded (nothing is
            written).
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
    frames = successes = kept = 0
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
                if success or keep_failures:
                    writer.save_episode()
                    frames += length
                    kept += 1
                else:  # a failed attempt is no demonstration
                    writer.clear_episode_buffer()
                successes += int(success)
                if on_episode is not None:
                    on_episode(ep, length, success)
            if kept == 0:
                raise DatasetError(
                    f"the {policy} expert succeeded in none of the {episodes} episodes, so "
                    f"nothing was written to {out}; give the episodes more steps (env "
                    "max_episode_steps) or keep failures"
                )
    finally:
        env.close()
    return RecordSummary(
        root=Path(out), episodes=episodes, frames=frames, successes=successes, kept=kept
    )


def refuse_failed_expert(summary: RecordSummary, expert: str = "scripted") -> None:
    """Delete a recording whose expert never succeeded and say so.

    Demonstrations that never reach the goal teach nothing: they are not expert data.

    Raises:
        DatasetError: no episode of the recording succeeded (it was deleted).
    """
    if summary.successes > 0:
        return
    shutil.rmtree(summary.root, ignore_errors=True)
    raise DatasetError(
        f"the {expert} expert succeeded in none of the {summary.episodes} episodes recorded "
        f"into {summary.root}: these are not expert demonstrations, so the recording was "
        "deleted; give the episodes more steps (env max_episode_steps) or record another task"
    )


def record_missing_dataset(
    spec: WorkloadSpec, on_episode: Callable[[int, int, bool], None] | None = None
) -> RecordSummary:
    """Record ``spec.dataset.record_episodes`` expert episodes into the missing dataset.

    By default (``dataset.record_failures`` false, as ``joynexus data record``) only
    successful episodes are written; with it every episode is, and a recording in which
    the expert never succeeded is kept (the workload asked for it) but logged as a
    warning.
    Callers show :attr:`RecordSummary.success_rate`.

    Raises:
        DatasetError: ``record_failures`` is off and the expert never succeeded.

    Returns:
        What was recorded (``root`` is ``spec.dataset.path``).
    """
    assert spec.dataset is not None and spec.env is not None
    summary = record_episodes(
        spec.env,
        spec.dataset.path,
        episodes=spec.dataset.record_episodes,
        seed=spec.seed,
        on_episode=on_episode,
        keep_failures=spec.dataset.record_failures,
    )
    if summary.successes == 0:
        log.warning(
            "%s: the scripted expert succeeded in none of the %d recorded episodes of %s; "
            "these demonstrations teach nothing (give the episodes more steps)",
            spec.tenant,
            summary.episodes,
            spec.env.kind,
        )
    return summary
