"""The one registry of resident architectures, found by name and by checkpoint.

Adding an architecture is a folder under ``models/archs/`` (a
:class:`~joynexus.models.archs.base.ResidentArch` and its
:class:`~joynexus.models.archs.base.Resident`, exported as ``ARCHES``) and one line in
:data:`BUILTIN_ARCHES` (or a :func:`register_arch` call, e.g. from a plug-in or a test).
The backbone asks this registry which architecture loads a checkpoint and never names
one itself.
"""

from __future__ import annotations

from joynexus.models.archs import lerobot_pi, paligemma, qwen_vl, smolvlm
from joynexus.models.archs.base import ResidentArch

BUILTIN_ARCHES: tuple[ResidentArch, ...] = (
    *qwen_vl.ARCHES,
    *paligemma.ARCHES,
    *lerobot_pi.ARCHES,
    *smolvlm.ARCHES,
)
"""The architectures every server knows."""

_ARCHES: dict[str, ResidentArch] = {}
_BY_MODEL_TYPE: dict[str, ResidentArch] = {}


def register_arch(arch: ResidentArch) -> None:
    """Make ``arch`` load the checkpoints it claims and those of its ``model_types``.

    Raises:
        ValueError: another architecture already holds its name or a model type.
    """
    held = _ARCHES.get(arch.name)
    if held is not None and held is not arch:
        raise ValueError(f"resident architecture {arch.name!r} is already registered")
    for kind in arch.model_types:
        other = _BY_MODEL_TYPE.get(kind)
        if other is not None and other is not arch:
            raise ValueError(f"model type {kind!r} is already loaded by {other.name!r}")
    _ARCHES[arch.name] = arch
    for kind in arch.model_types:
        _BY_MODEL_TYPE[kind] = arch


def unregister_arch(name: str) -> None:
    """Forget the architecture registered as ``name`` (no-op when none is)."""
    arch = _ARCHES.pop(name, None)
    if arch is not None:
        for kind in arch.model_types:
            if _BY_MODEL_TYPE.get(kind) is arch:
                del _BY_MODEL_TYPE[kind]


def arch_names() -> list[str]:
    """The registered architectures' names."""
    return list(_ARCHES)


def model_types() -> list[str]:
    """The ``transformers`` model types some registered architecture loads."""
    return sorted(_BY_MODEL_TYPE)


def arch_for_model_type(model_type: str) -> ResidentArch | None:
    """The architecture loading checkpoints of ``model_type`` (``None``: none does)."""
    return _BY_MODEL_TYPE.get(model_type)


def claiming(model_id: str, *, local_only: bool) -> tuple[ResidentArch, str] | None:
    """The architecture claiming ``model_id`` as a checkpoint of its own format (no
    ``transformers`` model directory), with the directory to load from.

    Raises:
        SpecError: an architecture recognizes the format but refuses this checkpoint.
    """
    for arch in _ARCHES.values():
        path = arch.claims(model_id, local_only=local_only)
        if path is not None:
            return arch, path
    return None


for _arch in BUILTIN_ARCHES:
    register_arch(_arch)

__all__ = [
    "BUILTIN_ARCHES",
    "arch_for_model_type",
    "arch_names",
    "claiming",
    "model_types",
    "register_arch",
    "unregister_arch",
]
