"""Layout spec → Ray placement group (paper §4.1.1, §5.1).

A layout names the accelerators of the three resident roles as
``actor-inference-environment`` GPU counts: the paper's shared deployment is ``2-2-4``,
its isolated single-tenant baseline ``1-1-2``. :func:`build_placement` reserves one
placement group with one bundle per role (``PACK`` by default: the roles of one
deployment stay on as few nodes as possible; ``SPREAD`` / ``STRICT_SPREAD`` put them on
different nodes; a role's custom resource pins its bundle to the nodes that advertise
it) and :class:`ReservedGroup` hands out the scheduling options that put each service
actor into its role's bundle (the :class:`~joynexus.runtime.ray_hosting.RayPlacement`
of a plane uses them). When a node dies, Ray re-places its bundles on the nodes left
(if they can hold them) and the actors of those bundles are re-created there.

The inference bundle is split evenly among ``max_engines`` rollout engines, so an
elastic pool can grow to that many engines inside the reservation it already holds.
A role with zero GPUs (a CPU-only machine) gets a tiny CPU bundle instead, so the
layout still pins where each role runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from joynexus.errors import CapacityError, SpecError

__all__ = [
    "LAYOUTS",
    "STRATEGIES",
    "Layout",
    "ReservedGroup",
    "Role",
    "Strategy",
    "build_placement",
]

Role = Literal["actor", "inference", "environment"]
Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
STRATEGIES: tuple[Strategy, ...] = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
ROLES: tuple[Role, ...] = ("actor", "inference", "environment")
_CPU_ONLY_BUNDLE = 0.01  # a role without GPUs still needs a non-empty bundle


class Layout(BaseModel):
    """GPUs per resident role, and how many rollout engines share the inference GPUs.

    Attributes:
        actor_gpus: Training Model Service (the actor).
        inference_gpus: Inference Model Service (the rollout engines together).
        env_gpus: Environment Service (simulator rendering).
        max_engines: Upper bound of the rollout-engine pool (default: one per inference
            GPU, at least one).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    actor_gpus: float = Field(ge=0)
    inference_gpus: float = Field(ge=0)
    env_gpus: float = Field(ge=0)
    max_engines: int | None = Field(default=None, ge=1)

    @classmethod
    def parse(cls, text: str) -> Layout:
        """``"2-2-4"`` (or a name in :data:`LAYOUTS`) → a layout.

        Raises:
            SpecError: not three ``-``-separated non-negative numbers.
        """
        text = LAYOUTS.get(text, text)
        if not re.fullmatch(r"\d+(\.\d+)?-\d+(\.\d+)?-\d+(\.\d+)?", text):
            raise SpecError(
                f"layout {text!r}: expected ACTOR-INFERENCE-ENV GPU counts such as '2-2-4' "
                f"or one of {sorted(LAYOUTS)}",
                field="layout",
            )
        a, i, e = (float(x) for x in text.split("-"))
        return cls(actor_gpus=a, inference_gpus=i, env_gpus=e)

    @property
    def engines(self) -> int:
        if self.max_engines is not None:
            return self.max_engines
        return max(1, int(self.inference_gpus))

    def gpus(self, role: Role) -> float:
        return {
            "actor": self.actor_gpus,
            "inference": self.inference_gpus,
            "environment": self.env_gpus,
        }[role]

    @property
    def total_gpus(self) -> float:
        return self.actor_gpus + self.inference_gpus + self.env_gpus

    def bundles(self) -> list[dict[str, float]]:
        """One bundle per role, in :data:`ROLES` order."""
        out: list[dict[str, float]] = []
        for role in ROLES:
            gpus = self.gpus(role)
            out.append({"GPU": gpus} if gpus > 0 else {"CPU": _CPU_ONLY_BUNDLE})
        return out

    def __str__(self) -> str:
        def fmt(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else str(x)

        return f"{fmt(self.actor_gpus)}-{fmt(self.inference_gpus)}-{fmt(self.env_gpus)}"


#: Named layouts of the paper: the shared deployment and the isolated baseline.
LAYOUTS = {"shared": "2-2-4", "isolated": "1-1-2", "cpu": "0-0-0"}


@dataclass
class ReservedGroup:
    """A reserved placement group and the actor options of each role inside it."""

    layout: Layout
    group: Any  # ray.util.placement_group.PlacementGroup

    def bundle_index(self, role: Role) -> int:
        return ROLES.index(role)

    def actor_options(self, role: Role) -> dict[str, Any]:
        """``.options(**...)`` for an actor of ``role``: its bundle and GPU share.

        Actors ask for no CPU: the control loops are light and the machine's CPUs stay
        free for the environment workers; the GPU share is what pins them.
        """
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gpus = self.layout.gpus(role)
        if role == "inference":
            gpus = gpus / self.layout.engines
        opts: dict[str, Any] = {
            "num_cpus": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group,
                placement_group_bundle_index=self.bundle_index(role),
            ),
        }
        if gpus > 0:
            opts["num_gpus"] = gpus
        return opts

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.group)


def bundles_of(
    layout: Layout, role_resources: Mapping[Role, str] | None = None
) -> list[dict[str, float]]:
    """The layout's bundles, each role's with a sliver of its custom resource.

    Raises:
        SpecError: a role that is not one of :data:`ROLES`.
    """
    bundles = layout.bundles()
    for role, resource in (role_resources or {}).items():
        if role not in ROLES:
            raise SpecError(
                f"role_resources: unknown role {role!r}; roles are {list(ROLES)}",
                field="role_resources",
            )
        bundles[ROLES.index(role)][resource] = _CPU_ONLY_BUNDLE
    return bundles


def build_placement(
    layout: Layout,
    *,
    timeout_s: float = 30.0,
    name: str = "",
    strategy: Strategy = "PACK",
    role_resources: Mapping[Role, str] | None = None,
) -> ReservedGroup:
    """Reserve ``layout``'s placement group and wait until it is placed.

    Args:
        layout: GPUs per role.
        timeout_s: How long to wait for the cluster to place the group.
        name: The group's name.
        strategy: How the bundles spread over nodes (see module docstring).
        role_resources: A custom node resource per role (its bundle asks for a sliver).

    Raises:
        SpecError: an unknown strategy or role.
        CapacityError: the cluster cannot place it within ``timeout_s`` (for instance a
            2-2-4 layout on a cluster with fewer than 8 GPUs, or ``STRICT_SPREAD`` on
            fewer nodes than roles).
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    if strategy not in STRATEGIES:
        raise SpecError(
            f"placement strategy {strategy!r}: expected one of {list(STRATEGIES)}",
            field="strategy",
        )
    bundles = bundles_of(layout, role_resources)
    group = placement_group(bundles, strategy=strategy, name=name)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        available = ray.available_resources().get("GPU", 0.0)  # type: ignore[no-untyped-call]  # ray's API is untyped here
        live: list[Any] = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]  # ray's API is untyped here
        nodes = len(live)
        raise CapacityError(
            f"layout {layout} needs {layout.total_gpus:g} GPUs in one placement group "
            f"(bundles {bundles}, strategy {strategy}); the cluster has {available:g} "
            f"GPUs available on {nodes} live node(s)"
        )
    return ReservedGroup(layout=layout, group=group)
