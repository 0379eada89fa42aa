"""Tenant-indexed, versioned serving states of the Inference Model Service.

Per tenant it keeps the latest published version plus every version pinned by a
running evaluation or rollout; an older version is freed as soon as nobody pins it and
a newer one is published. Each version is its own :class:`TenantSlot` object, never
written while anything but these states holds it, so a batch that resolved a slot keeps
consistent weights even if a newer version lands meanwhile. A publication writes into
the tenant's last freed slot when nothing else holds it any more (its reference count
says so), else it builds a new slot: a tenant published after every SFT update would
otherwise build (and randomly initialise, under the backbone lock) a whole slot each
time, 1.6 of 1.8 ms per publication in the demo's profile. All
versions of a tenant share one inference generator, so sampling noise does not
restart at every publication. A tenant's normalization stats (from its config or the
payload it was added with) are set on every version's slot: a publication carries only
tensors, and the stats never change while the tenant trains.

Units: callers and envs speak env units, a tenant with normalization stats computes in
normalized (model) units. :func:`in_model_units` and :func:`env_actions` convert a
served request on its way in and out; :func:`model_state` and :func:`model_actions`
are what rollouts store in the Training Queue.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from joynexus.errors import ConflictError, NotFoundError
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.payload import TenantPayload, load_weights
from joynexus.models.normalization import NormalizationStats
from joynexus.models.tenant.slots import BaseModelRef, TenantSlot
from joynexus.services.tenancy import TenantConfig, build_slot

__all__ = ["ServingStates", "env_actions", "in_model_units", "model_actions", "model_state"]

#: ``sys.getrefcount`` of a slot only a local name holds (the name, the argument).
_SOLE_REFERENCE = 2


@dataclass
class _Tenant:
    config: TenantConfig
    latest: int
    versions: dict[int, TenantSlot]
    generator: torch.Generator
    normalization: NormalizationStats | None = None
    pins: dict[int, int] = field(default_factory=dict)
    #: The last version's slot freed, kept for the next publication to write into.
    spare: TenantSlot | None = None


class ServingStates:
    """Versioned slots of every served tenant (thread-safe).

    Args:
        base: The resident base model the slots attach to.
        build_guard: Held while a new slot is built (its initialisation draws from the
            process's RNG; the Inference Model Service passes the backbone lock).
    """

    def __init__(
        self,
        base: BaseModelRef,
        build_guard: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        self.base = base
        self._build_guard = build_guard
        self._tenants: dict[str, _Tenant] = {}
        self._lock = threading.Lock()

    def add_tenant(self, config: TenantConfig, payload: TenantPayload | None = None) -> None:
        """Serve ``config``'s tenant at version 0 or at ``payload``'s version.

        Raises:
            ConflictError: the tenant is already served.
            InvalidRequestError / SchemaMismatchError: a payload that does not fit.
        """
        slot = build_slot(config, self.base)
        if payload is not None:
            load_weights(slot, payload)
        with self._lock:
            if config.tenant_id in self._tenants:
                raise ConflictError(
                    f"tenant {config.tenant_id!r} is already served", tenant_id=config.tenant_id
                )
            self._tenants[config.tenant_id] = _Tenant(
                config=config,
                latest=slot.policy_version,
                versions={slot.policy_version: slot},
                generator=slot.inference_generator,
                normalization=slot.normalization,
            )

    def _tenant(self, tenant_id: str) -> _Tenant:
        tenant = self._tenants.get(tenant_id)
        if tenant is None:
            raise NotFoundError(
                f"tenant {tenant_id!r} is not served here; served: {sorted(self._tenants)}",
                tenant_id=tenant_id,
            )
        return tenant

    def tenant_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._tenants)

    def remove_tenant(self, tenant_id: str) -> None:
        """Stop serving ``tenant_id``: every held version is dropped.

        Raises:
            NotFoundError: the tenant is not served here.
        """
        with self._lock:
            self._tenant(tenant_id)
            del self._tenants[tenant_id]

    def latest(self, tenant_id: str) -> int:
        with self._lock:
            return self._tenant(tenant_id).latest

    def held_versions(self, tenant_id: str) -> list[int]:
        """Versions currently held (latest + pinned)."""
        with self._lock:
            return sorted(self._tenant(tenant_id).versions)

    def slot(self, tenant_id: str, version: int | None = None) -> TenantSlot:
        """The slot serving ``version`` (default: latest).

        Raises:
            NotFoundError: unknown tenant.
            ConflictError: the version is not held (never published, or freed).
        """
        with self._lock:
            tenant = self._tenant(tenant_id)
            v = tenant.latest if version is None else version
            slot = tenant.versions.get(v)
            if slot is None:
                raise ConflictError(
                    f"tenant {tenant_id!r}: policy version {v} is not served; held versions "
                    f"{sorted(tenant.versions)} (pin a version to keep it while you use it)",
                    tenant_id=tenant_id,
                    requested=v,
                    available=sorted(tenant.versions),
                )
            return slot

    def publish(
        self, tenant_id: str, version: int, named_tensors: Mapping[str, torch.Tensor]
    ) -> None:
        """Install ``named_tensors`` as ``version`` of the tenant (validated first).

        Raises:
            NotFoundError: unknown tenant.
            ConflictError: ``version`` is older than the latest published one.
            InvalidRequestError: wrong names / shapes / dtypes.
            SchemaMismatchError: never raised for a payload built here (same signature).
        """
        with self._lock:
            tenant = self._tenant(tenant_id)
            if version < tenant.latest:
                raise ConflictError(
                    f"tenant {tenant_id!r}: cannot publish version {version}, version "
                    f"{tenant.latest} is already served",
                    tenant_id=tenant_id,
                    requested=version,
                    latest=tenant.latest,
                )
            config = tenant.config
            slot, tenant.spare = tenant.spare, None
        # Held by nothing but this frame and getrefcount's argument: no batch or rollout
        # resolved it, and none can now (it is in no version table), so writing it is safe.
        if slot is None or sys.getrefcount(slot) > _SOLE_REFERENCE:
            with self._build_guard():
                slot = build_slot(config, self.base)
        slot.inference_generator = tenant.generator
        slot.normalization = tenant.normalization
        load_weights(
            slot,
            TenantPayload(
                tenant_id=tenant_id,
                policy_version=version,
                schema_signature=slot.schema_signature,
                named_tensors=dict(named_tensors),
            ),
        )
        with self._lock:
            if version < tenant.latest:  # a newer one won the race while we built
                raise ConflictError(
                    f"tenant {tenant_id!r}: version {tenant.latest} was published while "
                    f"version {version} was being loaded",
                    tenant_id=tenant_id,
                )
            tenant.versions[version] = slot
            tenant.latest = version
            self._free_unpinned(tenant)

    def _free_unpinned(self, tenant: _Tenant) -> None:
        for v in sorted(tenant.versions):
            if v != tenant.latest and tenant.pins.get(v, 0) == 0:
                tenant.spare = tenant.versions.pop(v)

    @contextmanager
    def pinned(self, tenant_id: str, version: int | None = None) -> Iterator[int]:
        """Resolve the version once (default: latest) and keep it served until exit.

        Raises:
            NotFoundError: unknown tenant.
            ConflictError: the version is not held.
        """
        with self._lock:
            tenant = self._tenant(tenant_id)
            v = tenant.latest if version is None else version
            if v not in tenant.versions:
                raise ConflictError(
                    f"tenant {tenant_id!r}: cannot pin version {v}; held versions "
                    f"{sorted(tenant.versions)}",
                    tenant_id=tenant_id,
                    requested=v,
                )
            tenant.pins[v] = tenant.pins.get(v, 0) + 1
        try:
            yield v
        finally:
            with self._lock:
                tenant.pins[v] -= 1
                if tenant.pins[v] == 0:
                    del tenant.pins[v]
                self._free_unpinned(tenant)


# --- a tenant's units -----------------------------------------------------------------


def model_state(state: np.ndarray, normalization: NormalizationStats | None) -> np.ndarray:
    """Env-unit ``state [B, S]`` in the tenant's model units (unchanged without stats)."""
    if normalization is None or normalization.state is None or state.shape[-1] == 0:
        return state
    return normalization.normalize(state, "state")


def model_actions(actions: np.ndarray, normalization: NormalizationStats | None) -> np.ndarray:
    """Env-unit ``actions [..., A]`` in the tenant's model units."""
    if normalization is None:
        return actions
    return normalization.normalize(actions, "action")


def env_actions(actions: np.ndarray, normalization: NormalizationStats | None) -> np.ndarray:
    """Model-unit ``actions [..., A]`` (what the head outputs) in env units."""
    if normalization is None:
        return actions
    return normalization.unnormalize(actions, "action")


def in_model_units(
    observations: ObservationBatch, normalization: NormalizationStats | None
) -> ObservationBatch:
    """``observations`` (env units) with state and actions in the tenant's model units."""
    if normalization is None:
        return observations
    actions = observations.actions
    return dataclasses.replace(
        observations,
        state=model_state(observations.state, normalization),
        actions=None if actions is None else model_actions(actions, normalization),
    )
