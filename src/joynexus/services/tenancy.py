"""Tenant configuration shared by the Training and Inference Model Services.

A :class:`TenantConfig` is everything a service needs to build one tenant's
:class:`~joynexus.models.tenant.slots.TenantSlot` (schema, action module, optimizer, critic,
seed) plus where its checkpoints go. It is plain pydantic data, so it crosses a process
(Ray actor) boundary unchanged.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from joynexus.models.checkpoints.payload import check_normalization
from joynexus.models.normalization import NormalizationStats
from joynexus.models.policies import HeadConfig, OFTHeadConfig, ValueHeadConfig
from joynexus.models.schema import DataSchema
from joynexus.models.tenant.slots import BaseModelRef, OptimizerConfig, TenantSlot
from joynexus.spec.workload import AlgorithmSpec, WorkloadSpec
from joynexus.utils.priority_lock import PriorityRLock

__all__ = ["TenantConfig", "TenantInfo", "backbone_lock", "build_slot"]


class TenantConfig(BaseModel):
    """One tenant as the model services see it.

    Attributes:
        tenant_id: The tenant (a path-safe id; it names its checkpoint directory).
        schema_: The tenant's data schema (``schema`` in YAML/JSON).
        head: Action module config (OFT or flow matching).
        optimizer: The tenant's AdamW settings.
        value_head: Whether the tenant trains a critic (PPO).
        algorithm: Learning algorithm and its hyperparameters.
        seed: Seeds the slot's initialisation and its private generators.
        output_dir: Root of the tenant's checkpoints (``<output_dir>/<tenant>/step_<n>``);
            a relative path is resolved against the service's output dir.
        normalization: State/action normalization of a tenant trained on normalized
            data (SFT: the dataset's stats). Its slot computes in normalized units;
            serving normalizes env state in and returns actions in env units, and
            rollouts store normalized state/actions, like SFT partitions.
        init_checkpoint: Start the slot from this checkpoint of another tenant
            (``init_from``: RL from an SFT tenant) — its action module and
            normalization, not its optimizer or version; the tenant's own checkpoints
            (a resumed workload) still take precedence.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    tenant_id: str = Field(min_length=1, max_length=128)
    schema_: DataSchema = Field(alias="schema")
    head: HeadConfig = Field(default_factory=OFTHeadConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    value_head: bool = False
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    seed: int = 0
    output_dir: Path = Path("runs")
    normalization: NormalizationStats | None = None
    init_checkpoint: Path | None = None

    @classmethod
    def from_spec(cls, spec: WorkloadSpec, schema: DataSchema) -> TenantConfig:
        """The config of ``spec``'s tenant, with ``schema`` resolved by the caller
        (declared, preset, or derived from the env / dataset)."""
        return cls(
            tenant_id=spec.tenant,
            schema_=schema,
            head=spec.action_module,
            optimizer=spec.optimizer,
            value_head=spec.uses_value_head,
            # The KL anchor's default depends on init_from, which the config does not
            # carry: resolved here, once.
            algorithm=spec.algorithm.model_copy(update={"kl_coef": spec.anchor_coef()}),
            seed=spec.seed,
            output_dir=spec.output_dir,
        )


@dataclass(frozen=True)
class TenantInfo:
    """What ``add_tenant`` returns."""

    tenant_id: str
    schema_signature: str
    policy_version: int


def build_slot(config: TenantConfig, base: BaseModelRef) -> TenantSlot:
    """A fresh slot for ``config`` on ``base`` (equal configs → identical slots).

    Raises:
        SchemaMismatchError: ``config.normalization`` does not fit the schema.
    """
    slot = TenantSlot(
        config.tenant_id,
        config.schema_,
        base,
        config.head,
        optimizer=config.optimizer,
        # The critic sees what the actor sees: its own copy of the actor's image encoder.
        value_head=ValueHeadConfig(image_encoder=getattr(config.head, "image_encoder", None))
        if config.value_head
        else None,
        seed=config.seed,
    )
    if config.normalization is not None:
        check_normalization(slot, config.normalization)
        slot.normalization = config.normalization
    elif (default := base.default_normalization(config.schema_)) is not None:
        # A tenant without statistics of its own computes in the units its pretrained
        # checkpoint's processors normalize to (its own, from a dataset, win).
        slot.normalization = default
    return slot


# Keyed by the base model object itself (weakly), so the lock lives exactly as long as
# the backbone and every service holding that backbone in this process shares it.
_BACKBONE_LOCKS: weakref.WeakKeyDictionary[Any, PriorityRLock] = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


def backbone_lock(base: Any) -> PriorityRLock:
    """The lock that serialises torch work on ``base`` across services and threads.

    The Training and Inference Model Services run torch in worker threads; when they
    share one resident backbone in one process they must never run it concurrently.
    Predict batches take it as priority acquirers and a training step yields to them
    between its phases (:mod:`joynexus.utils.priority_lock`), so serving waits at most
    one phase of a step.
    """
    with _REGISTRY_LOCK:
        lock = _BACKBONE_LOCKS.get(base)
        if lock is None:
            lock = _BACKBONE_LOCKS[base] = PriorityRLock()
        return lock
