"""The environment specs tenants may use over HTTP (sessions and workloads).

Both paths use the checks of :mod:`joynexus.envs.limits`:

* ``POST /v1/env/sessions``: the spec against the server's environment limits
  (``max_num_envs``, ``max_image_size``, ``denied_env_kinds``): the hosted Master's
  ``MasterLimits`` — the object a workload's ``env`` is checked against — or, on a
  server without a Master, the defaults (:class:`~joynexus.envs.limits.EnvLimits`);
  ``ServerConfig.denied_env_kinds`` is denied on top. Then the gym allow-list.
* ``POST /v1/workloads``: the gym allow-list of the workload's ``env`` before the
  Master sees the spec (compiling a gym spec builds the env once to infer its schema,
  which would import the modules); the Master checks the limits itself.

The gym allow-list is the admin's ``ServerConfig.gym_allowed_ids`` /
``gym_allowed_imports`` / ``gym_allowed_make_kwargs``; a spec asking for anything else
answers 403 with a message naming the setting, a limit exceeded 422.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from joynexus.envs.base import EnvSpec
from joynexus.envs.limits import (
    EnvLimits,
    EnvLimitsLike,
    GymAllowlist,
    env_limit_problems,
    gym_problems,
    raise_env_problems,
)
from joynexus.server.config import ServerConfig
from joynexus.server.state import ServerState

__all__ = ["check_session_spec", "check_workload_env", "env_limits", "gym_allowlist"]


@dataclass(frozen=True)
class _Limits:
    max_num_envs: int
    max_image_size: int
    denied_env_kinds: Sequence[str]


def env_limits(state: ServerState) -> EnvLimitsLike:
    """The hosted Master's limits (``MasterLimits``), else the defaults."""
    master = state.services.master
    return master.limits if master is not None else EnvLimits()


def gym_allowlist(config: ServerConfig) -> GymAllowlist:
    """The admin's gym allow-list of ``config``."""
    return GymAllowlist(
        ids=None if config.gym_allowed_ids is None else tuple(config.gym_allowed_ids),
        imports=tuple(config.gym_allowed_imports),
        make_kwargs=tuple(config.gym_allowed_make_kwargs),
        setting="ServerConfig.gym_allowed_{}",
    )


def check_session_spec(state: ServerState, spec: EnvSpec) -> None:
    """Refuse a session spec the server does not allow.

    Raises:
        PermissionDeniedError: a denied kind, or a gym id / import / ``make_kwargs`` key
            the allow-list does not list (403).
        SpecError: ``num_envs`` or ``image_size`` above the limits, malformed gym options.
    """
    base = env_limits(state)
    extra = [k for k in state.config.denied_env_kinds if k not in base.denied_env_kinds]
    limits = _Limits(base.max_num_envs, base.max_image_size, [*base.denied_env_kinds, *extra])
    problems = env_limit_problems(spec, limits, prefix="spec.")
    problems += gym_problems(spec, gym_allowlist(state.config), prefix="spec.")
    raise_env_problems(problems, "environment spec")


def check_workload_env(state: ServerState, spec: EnvSpec | None) -> None:
    """Refuse a workload whose ``env`` asks for gym ids / imports / ``make_kwargs`` keys
    the allow-list does not list (403); nothing else is checked here.

    Raises:
        PermissionDeniedError, SpecError: see :func:`check_session_spec`.
    """
    if spec is not None:
        raise_env_problems(
            gym_problems(spec, gym_allowlist(state.config), prefix="env."), "workload spec"
        )
