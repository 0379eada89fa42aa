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

Groups (GRPO's rollouts per initial state): ``reset(seed=s, group_size=G)`` seeds
sub-env ``i`` with ``s + i // G``, so the ``G`` sub-envs of each group start from the same
initial state and different groups from different ones; ``num_envs`` must be a multiple
of ``G``. Auto-resets keep groups aligned by episode ordinal: the ``k``-th episode after
the reset of every sub-env of group ``g`` is seeded with ``s + g + k · num_envs / G``
(with ``G = 1`` this is the ungrouped sequence ``s + i + k · num_envs``). An adapter that
cannot honour groups need not accept ``group_size``: the Environment Service refuses a
grouped reset of it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from joynexus.errors import InvalidRequestError, SchemaMismatchError
from joynexus.models.schema import DataSchema
from joynexus.utils.jsondepth import check_json_depth

__all__ = [
    "EnvAdapter",
    "EnvObservation",
    "EnvSpec",
    "EnvStep",
    "ObservationSpec",
    "check_actions",
    "check_group_size",
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
        options: Kind-specific settings (remote: ``url``; see each adapter's docs),
            nested at most :data:`~joynexus.utils.jsondepth.MAX_JSON_DEPTH` levels.
        observation: Images and which state, where the kind offers a choice.
    """

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1, max_length=64)
    task: str | None = Field(default=None, max_length=256)
    num_envs: int = Field(default=1, ge=1, le=1024)
    image_size: int | None = Field(default=None, gt=0, le=4096)
    fast_render: bool = True
    max_episode_steps: int | None = Field(default=None, gt=0, le=10_000_000)
    # Bounded in depth: a workload stores its spec and serves it back, and pydantic
    # cannot serialize data nested past a fixed depth (joynexus.utils.jsondepth).
    options: Annotated[
        dict[str, Any], AfterValidator(lambda v: check_json_depth(v, where="options"))
    ] = Field(default_factory=dict)
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
    def reset(self, seed: int | None = None, *, group_size: int = 1) -> EnvObservation:
        """Start new episodes in every sub-env; sub-env ``i`` is seeded with ``seed + i``.

        With ``group_size`` G > 1, sub-env ``i`` is seeded with ``seed + i // G`` (see
        the module docstring for groups and their auto-resets).

        Raises:
            InvalidRequestError: ``group_size`` does not divide ``num_envs``.
        """

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


def check_group_size(num_envs: int, group_size: int) -> int:
    """The number of groups of a grouped reset (``num_envs / group_size``).

    Raises:
        InvalidRequestError: ``group_size`` is not a positive divisor of ``num_envs``.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InvalidRequestError(
            f"group_size must be a positive integer, got {group_size!r}", field="group_size"
        )
    if num_envs % group_size:
        raise InvalidRequestError(
            f"group_size={group_size} does not divide num_envs={num_envs}: the sub-envs "
            "form groups of group_size that share one initial state",
            field="group_size",
        )
    return num_envs // group_size


def stack_observations(
    frames: list[dict[str, np.ndarray]], states: list[np.ndarray], instruction: str
) -> EnvObservation:
    """Stack per-sub-env camera frames ``[H, W, C]`` and states into one observation."""
    names = list(frames[0]) if frames else []
    cameras = {name: np.stack([f[name] for f in frames]).astype(np.uint8) for name in names}
    state = np.stack(states).astype(np.float32) if states else np.zeros((0, 0), np.float32)
    return EnvObservation(cameras=cameras, state=state, instruction=instruction)
