"""How deep free-form JSON data nests, and the bound on what the service stores.

Job metadata and environment options are free-form JSON that the service stores and
serves back. A value nested a few hundred levels deep is only a few kilobytes, yet every
later answer that includes it fails: pydantic refuses to serialize past a fixed depth
(about 255 levels), so one stored job would break its tenant's job listing for good.
Free-form fields are therefore bounded in depth when they are validated, before anything
is stored (:data:`MAX_JSON_DEPTH`). The walk is iterative: it never recurses, whatever the
depth it is handed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_JSON_DEPTH", "check_json_depth", "json_depth_problem"]

#: Levels of objects and arrays a stored free-form value may nest (the outermost object
#: is level 1). Far above what settings and metadata need, far below pydantic's limit.
MAX_JSON_DEPTH = 32

#: Keys named in a refusal before the rest of the path is elided.
_SHOWN_KEYS = 6


def json_depth_problem(value: Any, limit: int = MAX_JSON_DEPTH, where: str = "value") -> str | None:
    """Where ``value`` (JSON data: dicts, lists, tuples, scalars) nests deeper than
    ``limit`` levels, as a sentence naming ``where`` and the limit; None when it does not.

    Args:
        value: The decoded JSON data.
        limit: Most levels of objects and arrays allowed.
        where: The field's name, as the caller knows it (``"metadata"``).
    """
    # (container, its level, index of its parent entry, key or index within the parent)
    entries: list[tuple[Any, int, int, object]] = []
    if isinstance(value, dict | list | tuple):
        entries.append((value, 1, -1, None))
    i = 0
    while i < len(entries):
        node, level, _, _ = entries[i]
        if level > limit:
            return (
                f"{where}{_path(entries, i)} nests more than {limit} levels of objects "
                f"and arrays (the limit for free-form data); flatten it, or store large "
                "structures elsewhere and put a reference here"
            )
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(child, dict | list | tuple):
                entries.append((child, level + 1, i, key))
        i += 1
    return None


def check_json_depth(value: Any, limit: int = MAX_JSON_DEPTH, where: str = "value") -> Any:
    """``value`` unchanged when it nests at most ``limit`` levels (a pydantic
    ``AfterValidator``: the refusal becomes a 422 located at the field).

    Raises:
        ValueError: :func:`json_depth_problem`'s sentence.
    """
    problem = json_depth_problem(value, limit, where)
    if problem is not None:
        raise ValueError(problem)
    return value


def _path(entries: list[tuple[Any, int, int, object]], index: int) -> str:
    """The keys leading to ``entries[index]``, as ``['a'][0]…``, the middle elided."""
    keys: list[object] = []
    while entries[index][2] >= 0:
        keys.append(entries[index][3])
        index = entries[index][2]
    keys.reverse()
    parts = [f"[{k!r}]" for k in keys]
    if len(parts) > _SHOWN_KEYS:
        parts = [*parts[: _SHOWN_KEYS // 2], "…", *parts[-(_SHOWN_KEYS // 2) :]]
    return "".join(parts)
