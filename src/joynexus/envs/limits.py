"""What a server lets tenants open: one check of environment specs for every path.

Two kinds of rule, each a function that lists :class:`EnvProblem` s (it raises nothing,
so a caller can merge them with its own problems):

* **Limits** (:func:`env_limit_problems`): sub-envs per session (``max_num_envs``), the
  side of camera images (``max_image_size``) and the kinds nobody may use
  (``denied_env_kinds``), read from any object with those three attributes
  (:class:`EnvLimitsLike`): the Master's ``MasterLimits`` or :class:`EnvLimits`. The
  HTTP server checks an environment session against the hosted Master's limits, the
  very object a workload's ``env`` is checked against.
* **The gym allow-list** (:func:`gym_problems`): a ``kind: gym`` spec makes the process
  that builds it import modules (``options.imports``), call ``gymnasium.make(task,
  **options.make_kwargs)``, and a task id of the form ``module:Env-v0`` makes gymnasium
  import ``module`` itself. A tenant may name only what an admin listed
  (:class:`GymAllowlist`, from the server's ``ServerConfig.gym_allowed_*``); by default
  nothing extra: no imports, no ``make_kwargs`` keys, only ids gymnasium already has
  registered (never a ``module:`` id).

:func:`raise_env_problems` turns the list into one error: 403 when anything asked for
is not allowed, else 422 (a limit exceeded or a malformed option).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from joynexus.envs.base import EnvSpec
from joynexus.errors import PermissionDeniedError, SpecError

__all__ = [
    "EnvLimits",
    "EnvLimitsLike",
    "EnvProblem",
    "GymAllowlist",
    "env_limit_problems",
    "gym_problems",
    "raise_env_problems",
]


class EnvLimitsLike(Protocol):
    """The limits :func:`env_limit_problems` reads (``MasterLimits`` has them)."""

    @property
    def max_num_envs(self) -> int: ...
    @property
    def max_image_size(self) -> int: ...
    @property
    def denied_env_kinds(self) -> Sequence[str]: ...


class EnvLimits(BaseModel):
    """Limits on the environments tenants open (the defaults of ``MasterLimits``).

    Args:
        max_num_envs: Sub-envs of one session.
        max_image_size: Side of environment camera images.
        denied_env_kinds: Environment kinds tenants may not use (``remote`` makes the
            server connect to a URL the tenant chooses).
    """

    model_config = ConfigDict(extra="forbid")

    max_num_envs: int = Field(default=16, ge=1)
    max_image_size: int = Field(default=512, ge=1)
    denied_env_kinds: list[str] = Field(default_factory=lambda: ["remote"])


@dataclass(frozen=True)
class EnvProblem:
    """One thing a spec asks for that the server does not allow.

    Attributes:
        field: The spec field, with the caller's prefix (``env.num_envs``).
        message: What is wrong and which setting allows it.
        forbidden: Not allowed at all (403) rather than too big or malformed (422).
    """

    field: str
    message: str
    forbidden: bool = False


def env_limit_problems(
    spec: EnvSpec, limits: EnvLimitsLike, *, prefix: str = ""
) -> list[EnvProblem]:
    """``spec`` against ``max_num_envs``, ``max_image_size`` and ``denied_env_kinds``."""
    problems: list[EnvProblem] = []
    if spec.kind in limits.denied_env_kinds:
        problems.append(
            EnvProblem(
                f"{prefix}kind",
                f"{spec.kind!r} is not available on this server (denied kinds: "
                f"{list(limits.denied_env_kinds)})",
                forbidden=True,
            )
        )
    checks = (
        ("num_envs", spec.num_envs, limits.max_num_envs, "max_num_envs"),
        ("image_size", spec.image_size, limits.max_image_size, "max_image_size"),
    )
    for name, value, limit, setting in checks:
        if value is not None and value > limit:
            problems.append(
                EnvProblem(
                    f"{prefix}{name}",
                    f"{value} exceeds this server's limit of {limit} ({setting})",
                )
            )
    return problems


@dataclass(frozen=True)
class GymAllowlist:
    """What tenants may ask of a ``kind: gym`` spec (an admin's setting).

    Attributes:
        ids: The gymnasium ids tenants may open; None: any id gymnasium already has
            registered, but never a ``module:Env-v0`` id (it imports ``module``).
        imports: Modules tenants may list in ``options.imports``.
        make_kwargs: Keys tenants may pass in ``options.make_kwargs``.
        setting: How messages name the setting, ``{}`` standing for ``ids`` /
            ``imports`` / ``make_kwargs``.
    """

    ids: tuple[str, ...] | None = None
    imports: tuple[str, ...] = ()
    make_kwargs: tuple[str, ...] = ()
    setting: str = "gym_allowed_{}"


def gym_problems(spec: EnvSpec, allow: GymAllowlist, *, prefix: str = "") -> list[EnvProblem]:
    """The ids, imports and ``make_kwargs`` keys of a ``kind: gym`` spec that ``allow``
    does not list (nothing for other kinds)."""
    if spec.kind != "gym":
        return []
    problems: list[EnvProblem] = []
    task = spec.task or ""
    ids_setting = allow.setting.format("ids")
    if allow.ids is not None:
        if task not in allow.ids:
            problems.append(
                EnvProblem(
                    f"{prefix}task",
                    f"gymnasium id {task!r} is not one this server offers; an admin lists "
                    f"ids in {ids_setting} (allowed: {list(allow.ids)})",
                    forbidden=True,
                )
            )
    elif ":" in task:
        problems.append(
            EnvProblem(
                f"{prefix}task",
                f"gymnasium id {task!r} names a module to import ({task.split(':')[0]!r}); "
                f"tenants may not make the server import modules: use a registered id, or "
                f"ask an admin to list this one in {ids_setting}",
                forbidden=True,
            )
        )
    imports = spec.options.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(m, str) for m in imports):
        problems.append(EnvProblem(f"{prefix}options.imports", "must be a list of module names"))
    else:
        refused = [m for m in imports if m not in allow.imports]
        if refused:
            problems.append(
                EnvProblem(
                    f"{prefix}options.imports",
                    f"this server does not import {refused} for tenants; an admin allows "
                    f"modules with {allow.setting.format('imports')} "
                    f"(allowed: {list(allow.imports)})",
                    forbidden=True,
                )
            )
    make_kwargs = spec.options.get("make_kwargs", {})
    if not isinstance(make_kwargs, dict):
        problems.append(
            EnvProblem(f"{prefix}options.make_kwargs", "must be an object of keyword arguments")
        )
    else:
        refused = sorted(k for k in make_kwargs if k not in allow.make_kwargs)
        if refused:
            problems.append(
                EnvProblem(
                    f"{prefix}options.make_kwargs",
                    f"keyword argument(s) {refused} may not be passed to gymnasium.make on "
                    f"this server; an admin allows keys with "
                    f"{allow.setting.format('make_kwargs')} "
                    f"(allowed: {list(allow.make_kwargs)})",
                    forbidden=True,
                )
            )
    return problems


def raise_env_problems(problems: Sequence[EnvProblem], what: str = "environment spec") -> None:
    """Raise one error for ``problems`` (nothing when there are none).

    Raises:
        PermissionDeniedError: any problem is ``forbidden`` (only those are listed).
        SpecError: limits exceeded or malformed options.
    """
    if not problems:
        return
    forbidden = [p for p in problems if p.forbidden]
    shown = forbidden or list(problems)
    message = f"the {what} asks for what this server does not allow:\n" + "\n".join(
        f"  {p.field}: {p.message}" for p in shown
    )
    details = {"fields": [p.field for p in shown], "problems": {p.field: p.message for p in shown}}
    if forbidden:
        raise PermissionDeniedError(message, **details)
    raise SpecError(message, **details)
