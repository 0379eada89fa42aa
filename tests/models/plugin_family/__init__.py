"""A policy family with its own checkpoint, added by its folder alone (tests).

``packaged_oft`` is an OFT head that starts from the pretrained head of a packaged
resident model (:mod:`tests.models.plugin_arch`): it asks the resident model for its
typed :class:`~tests.models.plugin_arch.PackagedHead` extension and refuses any other
base. Registering it is one :func:`~joynexus.models.policies.registry.register_policy`
call.
"""

from __future__ import annotations

from typing import Literal

from joynexus.errors import SpecError
from joynexus.models.policies.base import PolicyFamily, PolicyHead
from joynexus.models.policies.oft import OFTHeadConfig
from joynexus.models.policies.oft.module import build_oft_head
from joynexus.models.schema import DataSchema
from joynexus.models.types import describe_base, extension_of
from tests.models.plugin_arch import PackagedHead


def packaged_head_of(base: object) -> PackagedHead:
    found = extension_of(base, PackagedHead)
    if found is None:
        raise SpecError(
            f"a 'packaged_oft' needs a packaged base model; the base {describe_base(base)}",
            field="action_module.type",
        )
    return found


class PackagedOFTConfig(OFTHeadConfig):
    type: Literal["packaged_oft"] = "packaged_oft"  # type: ignore[assignment]

    def check_base(self, base: object, schema: DataSchema) -> None:
        packaged_head_of(base)


def build_packaged_oft(
    config: PackagedOFTConfig, hidden_size: int, schema: DataSchema, base: object
) -> PolicyHead:
    head = build_oft_head(config, hidden_size, schema, base)
    head.load_state_dict(packaged_head_of(base).state)
    return head


FAMILY = PolicyFamily(PackagedOFTConfig, build_packaged_oft)
