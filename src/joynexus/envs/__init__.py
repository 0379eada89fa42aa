"""Simulator adapters and the env registry.

Importing this package registers every built-in env kind without importing any
simulator package: each adapter module (``pusht``, ``metaworld``, ``remote``, ...)
calls :func:`register_env` at import time with ``"module:function"`` factories and
imports its simulator lazily inside them. A new adapter module adds its name to
``_ADAPTER_MODULES``; modules not present in this tree are skipped.

See :mod:`joynexus.envs.base` for the adapter contract and the auto-reset rule.
"""

from __future__ import annotations

import importlib

from joynexus.envs.base import EnvAdapter, EnvObservation, EnvSpec, EnvStep, check_actions
from joynexus.envs.registry import (
    EnvKindInfo,
    env_schema,
    list_envs,
    make_env,
    register_env,
    unavailable_reason,
    unregister_env,
)

__all__ = [
    "EnvAdapter",
    "EnvKindInfo",
    "EnvObservation",
    "EnvSpec",
    "EnvStep",
    "check_actions",
    "env_schema",
    "list_envs",
    "make_env",
    "register_env",
    "unavailable_reason",
    "unregister_env",
]

_ADAPTER_MODULES = (
    "pusht",
    "metaworld",
    "gym_generic",
    "remote",
    "aloha",
    "maniskill",
    "libero",
    "reach2d",
)


def _register_builtin_kinds() -> None:
    for name in _ADAPTER_MODULES:
        module = f"{__name__}.{name}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # Only "this adapter module does not exist (yet)" is skipped; a missing
            # dependency inside an existing module is a bug and must surface.
            if exc.name != module:
                raise


_register_builtin_kinds()
