"""The one registry of policy families, found by ``action_module.type``.

A workload spec names its head in YAML (``action_module: {type: oft, ...}``);
:data:`HeadConfig` parses that mapping into the registered family's config, and
:func:`build_action_module` builds its head. Nothing else in the code base looks at a
head's type: what differs between families is behind :class:`PolicyConfig` and
:class:`PolicyHead`. Adding a family is a folder under ``models/policies/`` (config, module and a
``FAMILY = PolicyFamily(config, build)``) and one line in :data:`BUILTIN_FAMILIES` (or a
:func:`register_policy` call, e.g. from a plug-in or a test).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, GetJsonSchemaHandler, SerializeAsAny
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from joynexus.errors import InvalidRequestError
from joynexus.models.policies import flow_matching, oft, pi0_expert, pi05_expert, smolvla_expert
from joynexus.models.policies.base import PolicyConfig, PolicyFamily, PolicyHead
from joynexus.models.schema import DataSchema

BUILTIN_FAMILIES: tuple[PolicyFamily[Any], ...] = (
    oft.FAMILY,
    flow_matching.FAMILY,
    pi0_expert.FAMILY,
    smolvla_expert.FAMILY,
    pi05_expert.FAMILY,
)
"""The families every server knows, in the order error messages list them."""

_FAMILIES: dict[str, PolicyFamily[Any]] = {}


def register_policy(family: PolicyFamily[Any]) -> None:
    """Make ``family`` available to specs under its ``type``.

    Raises:
        ValueError: its config has no string default for ``type``, or another family
            already holds that type.
    """
    kind = family.type
    held = _FAMILIES.get(kind)
    if held is not None and held != family:
        raise ValueError(f"policy type {kind!r} is already registered by {held.config.__name__}")
    _FAMILIES[kind] = family


def unregister_policy(kind: str) -> None:
    """Forget a family registered under ``kind`` (no-op when none is)."""
    _FAMILIES.pop(kind, None)


def policy_types() -> list[str]:
    """The registered families' ``type`` names."""
    return list(_FAMILIES)


def parse_head_config(value: object) -> PolicyConfig:
    """The registered family's config for a spec's ``action_module`` mapping.

    Raises:
        PydanticCustomError: not a mapping, or no registered ``type`` (the message
            lists the registered ones).
        ValidationError: settings the family refuses.
    """
    if isinstance(value, PolicyConfig):
        return value
    if not isinstance(value, Mapping):
        raise PydanticCustomError(
            "policy_config",
            "expected a mapping with a 'type' (one of {types})",
            {"types": ", ".join(map(repr, _FAMILIES))},
        )
    kind = value.get("type")
    family = _FAMILIES.get(kind) if isinstance(kind, str) else None
    if family is None:
        raise PydanticCustomError(
            "union_tag_invalid",
            "type {kind} is not a registered policy family; expected one of {types}"
            if "type" in value
            else "a 'type' is required: one of {types}",
            {"kind": repr(kind), "types": ", ".join(map(repr, _FAMILIES))},
        )
    # A ValidationError here reaches the caller with its locations under action_module.
    config: type[PolicyConfig] = family.config
    return config.model_validate(value)


class _RegisteredFamilies:
    """JSON schema of :data:`HeadConfig`: one of the families registered when the schema
    is generated."""

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        choices: dict[Hashable, core_schema.CoreSchema] = {
            kind: family.config.__pydantic_core_schema__ for kind, family in _FAMILIES.items()
        }
        return handler(core_schema.tagged_union_schema(choices, discriminator="type"))


HeadConfig = Annotated[
    SerializeAsAny[PolicyConfig], BeforeValidator(parse_head_config), _RegisteredFamilies
]
"""Config of any registered policy family; ``type`` picks the family."""


def build_action_module(
    config: PolicyConfig,
    *,
    hidden_size: int,
    schema: DataSchema,
    base: object = None,
) -> PolicyHead:
    """A freshly initialised head of ``config``'s family, sized for ``schema`` and the
    backbone width (``base``: the resident base model a family may start from).

    Raises:
        InvalidRequestError: no family is registered under ``config.type``.
        SpecError: the base model cannot host the family, or the schema does not fit.
    """
    family = _FAMILIES.get(config.type)
    if family is None or not isinstance(config, family.config):
        raise InvalidRequestError(
            f"action_module.type {config.type!r} is not a registered policy family; "
            f"expected one of {policy_types()}",
            field="action_module.type",
        )
    return family.build(config, hidden_size, schema, base)


for _family in BUILTIN_FAMILIES:
    register_policy(_family)

__all__ = [
    "BUILTIN_FAMILIES",
    "HeadConfig",
    "build_action_module",
    "parse_head_config",
    "policy_types",
    "register_policy",
    "unregister_policy",
]
