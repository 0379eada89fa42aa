"""The environment adapter contract: what every simulator looks like to JoyNexus.

An adapter wraps one simulator (usually a gymnasium env, possibly several copies of it
for a vectorized session) and speaks the tenant's :class:`~joynexus.models.schema.DataSchema`:
camera images keyed by the schema's camera names, a float32 state vector, and the task's
language instruction.

Shapes (``N`` = ``num_envs``):

* ``EnvObservation.cameras[name]``: uint8 ``[N, H, W, C]`` matching ``schema.cameras[name]``
* ``EnvObservation.state``: float32 ``[N, schema.state_dim]``
* ``step(actions)``: ``actions`` float32 ``[N, schema.action_dim]``
* ``EnvStep.reward``: float32 ``[N]``; ``terminated``, ``truncated``, ``success``: bool ``[N]``

Auto-reset policy (the same for every adapter, vectorized or not): when sub-env ``i``'s
episode ends on a step (terminated or truncated), the adapter resets that sub-env inside
the same ``step`` call. Row ``i`` of the returned ``reward / terminated / truncated /
success`` describes the last transition of the finished episode, while row ``i`` of the
returned ``observation`` is already the first observation of the next episode; the last
observation of the finished episode is in ``info["final_observation"]`` (an
:class:`EnvObservation` over all ``N`` rows, where rows that did not end repeat the
current observation). This is gymnasium's "same-step" autoreset: a rollout loop never
has to special-case finished sub-envs, and ``reset`` is only needed to start over (for
instance with a new seed). ``reset(seed=s)`` seeds sub-env ``i`` with ``s + i``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from joynexus.errors import SchemaMismatchError
from joynexus.models.schema import DataSchema

__all__ = [
    "EnvAdapter",
    "EnvObservation",
    "EnvSpec",
    "EnvStep",
    "ObservationSpec",
    "check_actions",
    "stack_observations",
]


class ObservationSpec(BaseModel):
    """What a session observes, where the simulator offers a choice (docs/OBSERVATIONS.md).

    Args:
        images: Render the cameras (default). ``False``: the simulator renders nothing
            and every camera of the schema carries a constant black frame (the backbone
            keeps its image slot), so a policy learns from ``state`` at a fraction of
            the cost; kinds that cannot skip rendering refuse it.
        state: ``default`` (the kind's usual state), ``proprio`` (the robot's own
            state only) or ``privileged`` (the robot's state plus the simulator's object
            state: ManiSkill3's ``state`` observation, MetaWorld's full observation).
    """

    model_config = ConfigDict(extra="forbid")

    images: bool = True
    state: Literal["default", "proprio", "privileged"] = "default"


class EnvSpec(BaseModel):
    """What a tenant asks the Environment Service for.

    Args:
        kind: A registered env kind (``joynexus bench envs`` / :func:`list_envs` lists them),
            e.g. ``"pusht"``, ``"metaworld"``, ``"remote"``.
        task: The task within the kind (MetaWorld: ``"reach-v3"``; remote: unused).
        num_envs: Sub-envs stepped together by one session (vectorized when > 1).
        image_size: Side of the square camera images; ``None`` keeps the kind's default.
        fast_render: Turn off expensive rendering features (shadows, reflections, MSAA)
            where the simulator has them.
        max_episode_steps: Truncate episodes after this many steps; ``None`` keeps the
            simulator's own limit.
        options: Kind-specific settings (remote: ``url``; see each adapter's docs).
        observation: Images and which state, where the kind offers a choice.
    """

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1, max_length=64)
    task: str | None = Field(default=None, max_length=256)
    num_envs: int = Field(default=1, ge=1, le=1024)
    image_size: int | None = Field(default=None, gt=0, le=4096)
    fast_render: bool = True
    max_episode_steps: int | None = Field(default=None, gt=0, le=10_000_000)
    options: dict[str, Any] = Field(default_factory=dict)
    observation: ObservationSpec = Field(default_factory=ObservationSpec)


@dataclass
class EnvObservation:
    """One observation of ``N`` sub-envs, in the tenant's schema."""

    cameras: dict[str, np.ndarray]
    state: np.ndarray
    instruction: str

    @property
    def num_envs(self) -> int:
        return int(self.state.shape[0])


@dataclass
class EnvStep:
    """What one ``step`` returns (see the module docstring for the auto-reset rule)."""

    observation: EnvObservation
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    success: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)


class EnvAdapter(abc.ABC):
    """A simulator as JoyNexus sees it. Subclasses set ``schema`` and ``num_envs``.

    Adapters are used from one thread at a time (the Environment Service gives each
    simulator its own worker process) and need not be thread-safe.
    """

    schema: DataSchema
    num_envs: int

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> EnvObservation:
        """Start new episodes in every sub-env; sub-env ``i`` is seeded with ``seed + i``."""

    @abc.abstractmethod
    def step(self, actions: np.ndarray) -> EnvStep:
        """Apply float32 ``[N, action_dim]`` actions; finished sub-envs auto-reset.

        Raises:
            SchemaMismatchError: ``actions`` has the wrong shape.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the simulator (idempotent)."""

    def __enter__(self) -> EnvAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_actions(actions: Any, *, num_envs: int, action_dim: int) -> np.ndarray:
    """Validate and convert a batch of actions to float32 ``[num_envs, action_dim]``.

    Raises:
        SchemaMismatchError: The shape is not ``[num_envs, action_dim]`` or values are
            not finite.
    """
    arr = np.asarray(actions, dtype=np.float32)
    if arr.shape != (num_envs, action_dim):
        raise SchemaMismatchError(
            f"actions must have shape [num_envs={num_envs}, action_dim={action_dim}], "
            f"got {list(arr.shape)}",
            field="actions",
            expected=[num_envs, action_dim],
            got=list(arr.shape),
        )
    if not np.all(np.isfinite(arr)):
        raise SchemaMismatchError("actions contain NaN or infinite values", field="actions")
    return arr


def stack_observations(
    frames: list[dict[str, np.ndarray]], states: list[np.ndarray], instruction: str
) -> EnvObservation:
    """Stack per-sub-env camera frames ``[H, W, C]`` and states into one observation."""
    names = list(frames[0]) if frames else []
    cameras = {name: np.stack([f[name] for f in frames]).astype(np.uint8) for name in names}
    state = np.stack(states).astype(np.float32) if states else np.zeros((0, 0), np.float32)
    return EnvObservation(cameras=cameras, state=state, instruction=instruction)
