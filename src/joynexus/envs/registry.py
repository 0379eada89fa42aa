"""The env registry: env kinds declared by name, with their DataSchema.

Workload specs name an env kind (``"pusht"``, ``"metaworld"``, ...); the registry turns
an :class:`~joynexus.envs.base.EnvSpec` into a running adapter (:func:`make_env`) or
into the schema the tenant will see (:func:`env_schema`) without starting anything.

Registering a kind must stay cheap: a factory may be given as a ``"module:function"``
string and is imported only when an env of that kind is made, so importing
:mod:`joynexus.envs` never imports a simulator package. The same string (or a
module-level function, which pickles by reference) is what lets the Environment
Service rebuild the env in a freshly spawned worker process.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from joynexus.errors import SpecError

if TYPE_CHECKING:
    from joynexus.envs.base import EnvAdapter, EnvSpec
    from joynexus.models.schema import DataSchema

__all__ = [
    "EnvFactory",
    "EnvKindInfo",
    "EnvRegistration",
    "env_schema",
    "get_registration",
    "list_envs",
    "make_env",
    "register_env",
    "resolve_callable",
    "unavailable_reason",
    "unregister_env",
]

EnvFactory = Callable[["EnvSpec"], "EnvAdapter"]
SchemaFn = Callable[["EnvSpec"], "DataSchema"]
#: Says why an env kind cannot run on this machine (``None``: it can). Cheap: it looks
#: for files (assets, drivers) and starts nothing.
ReadyFn = Callable[[], "str | None"]


@dataclass(frozen=True)
class EnvKindInfo:
    """One row of :func:`list_envs`."""

    kind: str
    description: str
    available: bool
    reason: str | None = None


@dataclass(frozen=True)
class EnvRegistration:
    """A registered env kind. ``factory`` / ``schema`` are callables or ``"mod:fn"``."""

    kind: str
    factory: EnvFactory | str
    schema: SchemaFn | str
    description: str
    requires: tuple[str, ...]
    ready: ReadyFn | str | None = None
    #: ``observation.state`` choices the kind offers, and whether it can skip images.
    states: tuple[str, ...] = ("default",)
    images_optional: bool = False


_REGISTRY: dict[str, EnvRegistration] = {}


def resolve_callable(ref: Callable[..., Any] | str) -> Callable[..., Any]:
    """Import ``"package.module:function"`` (or return a callable unchanged).

    Raises:
        SpecError: The string is malformed or names nothing importable.
    """
    if not isinstance(ref, str):
        return ref
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise SpecError(f"expected a 'package.module:function' reference, got {ref!r}")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"cannot import {ref!r}: {exc}") from exc
    if not callable(obj):
        raise SpecError(f"{ref!r} is not callable")
    # Resolved dynamically by name: what it returns is the caller's to know.
    found: Callable[..., Any] = obj
    return found


def register_env(
    kind: str,
    factory: EnvFactory | str,
    *,
    schema: SchemaFn | str,
    description: str,
    requires: list[str] | tuple[str, ...] = (),
    ready: ReadyFn | str | None = None,
    replace: bool = False,
    states: tuple[str, ...] = ("default",),
    images_optional: bool = False,
) -> None:
    """Declare an env kind.

    Args:
        kind: The name workload specs use.
        factory: Builds the adapter from a spec; a module-level function or a
            ``"module:function"`` string (both can be rebuilt in a worker process).
        schema: Returns the DataSchema an env of this spec produces, without starting it.
        description: One line for ``list_envs`` / the CLI.
        requires: Python modules the factory needs; only their presence is checked
            (nothing is imported) to report availability.
        ready: What else the kind needs on this machine (assets, drivers): a function
            (or ``"module:function"``) returning why it cannot run, or ``None``. It is
            called by :func:`list_envs`, :func:`unavailable_reason` (spec validation)
            and :func:`make_env`, so it must be cheap and import no simulator.
        replace: Allow re-registering an existing kind.
        states: The ``observation.state`` values the kind offers.
        images_optional: The kind can run without rendering (``observation.images``).

    Raises:
        SpecError: ``kind`` is already registered and ``replace`` is false.
    """
    if not kind or not kind.replace("_", "").replace("-", "").isalnum():
        raise SpecError(f"env kind {kind!r} must use only letters, digits, '_' and '-'")
    if kind in _REGISTRY and not replace:
        raise SpecError(f"env kind {kind!r} is already registered")
    _REGISTRY[kind] = EnvRegistration(
        kind=kind,
        factory=factory,
        schema=schema,
        description=description,
        requires=tuple(requires),
        ready=ready,
        states=tuple(states),
        images_optional=images_optional,
    )


def unregister_env(kind: str) -> None:
    """Remove a kind (tests use this to clean up)."""
    _REGISTRY.pop(kind, None)


def get_registration(kind: str) -> EnvRegistration:
    """The registration of ``kind``.

    Raises:
        SpecError: Unknown kind; the message lists the known ones.
    """
    try:
        return _REGISTRY[kind]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise SpecError(
            f"unknown env kind {kind!r}; known kinds: {known}",
            field="kind",
            known=sorted(_REGISTRY),
        ) from None


def _missing_modules(requires: tuple[str, ...]) -> list[str]:
    missing = []
    for mod in requires:
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(mod)
    return missing


def _unavailable(reg: EnvRegistration) -> tuple[list[str], str | None]:
    missing = _missing_modules(reg.requires)
    if missing:
        return missing, f"missing Python module(s): {', '.join(missing)}"
    if reg.ready is None:
        return [], None
    try:
        reason: str | None = resolve_callable(reg.ready)()
    except SpecError as exc:  # e.g. a configured asset path that is not usable
        reason = exc.message
    return [], reason


def unavailable_reason(kind: str) -> str | None:
    """Why env kind ``kind`` cannot run on this machine, or ``None`` when it can.

    Checks the Python modules it needs and its ``ready`` check (assets, drivers)
    without starting anything.

    Raises:
        SpecError: Unknown kind.
    """
    return _unavailable(get_registration(kind))[1]


def _check_observation(reg: EnvRegistration, spec: EnvSpec) -> None:
    """Refuse an ``observation`` choice the kind does not offer."""
    obs = spec.observation
    if obs.state not in reg.states:
        raise SpecError(
            f"env kind {spec.kind!r} offers observation.state {list(reg.states)}, "
            f"got {obs.state!r}",
            field="env.observation.state",
        )
    if not obs.images and not reg.images_optional:
        raise SpecError(
            f"env kind {spec.kind!r} always renders its cameras; observation.images: false "
            "is offered by "
            + ", ".join(sorted(k for k, r in _REGISTRY.items() if r.images_optional)),
            field="env.observation.images",
        )


def env_schema(spec: EnvSpec) -> DataSchema:
    """The DataSchema an env built from ``spec`` produces (starts no simulator).

    Raises:
        SpecError: Unknown kind, or the spec is invalid for that kind.
    """
    reg = get_registration(spec.kind)
    _check_observation(reg, spec)
    fn = resolve_callable(reg.schema)
    result: DataSchema = fn(spec)
    return result


def make_env(spec: EnvSpec) -> EnvAdapter:
    """Build and return an adapter for ``spec`` in this process.

    Raises:
        SpecError: Unknown kind, invalid spec, or the simulator package is not installed.
    """
    reg = get_registration(spec.kind)
    _check_observation(reg, spec)
    missing, reason = _unavailable(reg)
    if missing:
        raise SpecError(
            f"env kind {spec.kind!r} needs the Python module(s) {', '.join(missing)}; "
            "install them (pip install 'joynexus[sim]')",
            kind=spec.kind,
            missing=missing,
        )
    if reason is not None:
        raise SpecError(f"env kind {spec.kind!r} cannot run here: {reason}", kind=spec.kind)
    factory = resolve_callable(reg.factory)
    adapter: EnvAdapter = factory(spec)
    return adapter


def list_envs() -> list[EnvKindInfo]:
    """Every registered kind, with whether it can run on this machine and why not."""
    rows = []
    for kind in sorted(_REGISTRY):
        reg = _REGISTRY[kind]
        _, reason = _unavailable(reg)
        rows.append(EnvKindInfo(kind, reg.description, available=reason is None, reason=reason))
    return rows
