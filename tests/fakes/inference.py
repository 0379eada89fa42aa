"""The fake Inference Model Service: versioned numpy "weights" and zero actions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import torch

from joynexus.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    SchemaMismatchError,
    ServiceUnavailableError,
)
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.payload import TenantPayload
from joynexus.queues.inference import InferenceQueue
from joynexus.queues.inference_metrics import InferenceQueueMetrics
from joynexus.queues.training import TrainingQueue
from joynexus.services.inference import check_finite_tensors
from joynexus.services.rollout import (
    EvalResult,
    PredictResult,
    RolloutConfig,
    RolloutStats,
    collect_rollout,
    run_evaluation,
)
from joynexus.services.tenancy import TenantConfig
from tests.fakes.base import WEIGHT, WEIGHT_SIZE, FakeBase, _thread_hop
from tests.fakes.environment import FakeEnvironmentService


@dataclass
class _Served:
    config: TenantConfig
    signature: str
    latest: int
    versions: dict[int, np.ndarray]
    pins: dict[int, int] = field(default_factory=dict)

    def free_unpinned(self) -> None:
        for v in list(self.versions):
            if v != self.latest and not self.pins.get(v):
                del self.versions[v]


async def _never_batched(requests: Sequence[Any]) -> list[Any]:
    raise AssertionError("the fake serves without the Inference Queue")


class FakeInferenceService:
    """The Inference Model Service's contract (``tests/contracts``) without a model.

    ``predict`` answers zero actions (``[B, chunk, A]``), zero log-probs in ``sample``
    mode with an OFT (Gaussian) head and zero values with a critic. ``rollout`` and
    ``evaluate`` are the real loops of :mod:`joynexus.services.rollout` over this
    ``predict`` and the (fake) Environment Service, with the version pinned as the real
    service pins it.

    Attributes:
        published: Per tenant, every version it was served at, in order (``add_tenant``
            and ``load_weights``).
        rollout_delay_s: Seconds each rollout takes before it collects (a slow simulator).
    """

    def __init__(self, base: FakeBase, env: FakeEnvironmentService, queue: TrainingQueue) -> None:
        self.base = base
        self.env = env
        self.queue = queue
        self.running = False
        self._tenants: dict[str, _Served] = {}
        self.published: dict[str, list[int]] = {}
        self.rollout_delay_s = 0.0
        self._idle_queue = InferenceQueue(_never_batched)  # only for its (zero) metrics

    async def start(self) -> None:
        self.running = True

    async def stop(self) -> None:
        self.running = False

    @property
    def metrics(self) -> InferenceQueueMetrics:
        return self._idle_queue.metrics

    def _tenant(self, tenant_id: str) -> _Served:
        served = self._tenants.get(tenant_id)
        if served is None:
            raise NotFoundError(
                f"tenant {tenant_id!r} is not served here; served: {sorted(self._tenants)}",
                tenant_id=tenant_id,
            )
        return served

    def tenant_ids(self) -> list[str]:
        return sorted(self._tenants)

    @staticmethod
    def _weights(tenant_id: str, named: Mapping[str, torch.Tensor]) -> np.ndarray:
        check_finite_tensors(named)
        value = named.get(WEIGHT)
        if set(named) != {WEIGHT} or value is None:
            raise InvalidRequestError(
                f"tenant {tenant_id!r}: tensors {sorted(named)} do not fit its action module "
                f"(expected {[WEIGHT]})"
            )
        if tuple(value.shape) != (WEIGHT_SIZE,) or value.dtype != torch.float32:
            raise InvalidRequestError(
                f"tenant {tenant_id!r}: {WEIGHT} is {value.dtype} {tuple(value.shape)}, "
                f"expected float32 ({WEIGHT_SIZE},)"
            )
        return value.detach().cpu().numpy().copy()

    async def add_tenant(self, config: TenantConfig, payload: TenantPayload | None = None) -> None:
        tid = config.tenant_id
        signature = self.base.signature_for(config.schema_)
        version, weights = 0, np.zeros(WEIGHT_SIZE, np.float32)
        if payload is not None:
            if payload.tenant_id != tid:
                raise InvalidRequestError(
                    f"payload belongs to tenant {payload.tenant_id!r}, not {tid!r}",
                    field="tenant_id",
                )
            if payload.schema_signature != signature:
                raise SchemaMismatchError(
                    f"payload schema signature {payload.schema_signature!r} does not match "
                    f"tenant {tid!r}'s {signature!r}",
                    field="schema_signature",
                )
            version, weights = payload.policy_version, self._weights(tid, payload.named_tensors)
        await _thread_hop()
        if tid in self._tenants:
            raise ConflictError(f"tenant {tid!r} is already served", tenant_id=tid)
        self._tenants[tid] = _Served(config, signature, version, {version: weights})
        self.published.setdefault(tid, []).append(version)

    async def remove_tenant(self, tenant_id: str) -> None:
        self._tenant(tenant_id)
        await _thread_hop()
        self._tenant(tenant_id)
        del self._tenants[tenant_id]

    async def load_weights(
        self, tenant_id: str, version: int, named_tensors: Mapping[str, torch.Tensor]
    ) -> None:
        self._newer(tenant_id, version)
        weights = self._weights(tenant_id, named_tensors)
        await _thread_hop()
        served = self._newer(tenant_id, version)  # a newer one may have landed meanwhile
        served.versions[version] = weights
        served.latest = version
        served.free_unpinned()
        self.published.setdefault(tenant_id, []).append(version)

    def _newer(self, tenant_id: str, version: int) -> _Served:
        served = self._tenant(tenant_id)
        if version < served.latest:
            raise ConflictError(
                f"tenant {tenant_id!r}: cannot publish version {version}, version "
                f"{served.latest} is already served",
                tenant_id=tenant_id,
            )
        return served

    def current_policy_version(self, tenant_id: str) -> int:
        return self._tenant(tenant_id).latest

    @contextmanager
    def _pinned(self, tenant_id: str, version: int | None) -> Iterator[int]:
        served = self._tenant(tenant_id)
        v = served.latest if version is None else version
        if v not in served.versions:
            raise ConflictError(
                f"tenant {tenant_id!r}: cannot pin version {v}; held versions "
                f"{sorted(served.versions)}",
                tenant_id=tenant_id,
            )
        served.pins[v] = served.pins.get(v, 0) + 1
        try:
            yield v
        finally:
            served.pins[v] -= 1
            served.free_unpinned()

    async def predict(
        self,
        observations: ObservationBatch,
        tenant_id: str,
        policy_version: int | None = None,
        *,
        mode: Literal["mean", "sample"] = "mean",
        session_id: str = "predict",
    ) -> PredictResult:
        served = self._tenant(tenant_id)
        v = served.latest if policy_version is None else policy_version
        if v not in served.versions:
            raise ConflictError(
                f"tenant {tenant_id!r}: policy version {v} is not served; held versions "
                f"{sorted(served.versions)}",
                tenant_id=tenant_id,
            )
        schema = served.config.schema_
        observations.validate(schema)
        if not self.running:
            raise ServiceUnavailableError(
                "the inference model service is not running; call start() or use 'async with'"
            )
        await _thread_hop()
        b = observations.batch_size
        gaussian = served.config.head.type == "oft"
        return PredictResult(
            actions=np.zeros((b, schema.action_chunk, schema.action_dim), np.float32),
            log_probs=np.zeros(b, np.float32) if mode == "sample" and gaussian else None,
            values=np.zeros(b, np.float32) if served.config.value_head else None,
            policy_version=v,
        )

    async def rollout(
        self,
        config: RolloutConfig,
        job_id: str,
        partition_id: str,
        num_envs: int,
        horizon: int,
        version: int,
        *,
        heartbeat: Callable[[], None] | None = None,
    ) -> RolloutStats:
        with self._pinned(config.tenant_id, version) as v:
            served = self._tenant(config.tenant_id)
            if config.schema_signature != served.signature:
                raise SchemaMismatchError(
                    f"rollout of tenant {config.tenant_id!r}: schema signature "
                    f"{config.schema_signature!r} is not the tenant's {served.signature!r}",
                    field="schema_signature",
                )
            if self.rollout_delay_s > 0:
                await asyncio.sleep(self.rollout_delay_s)
            return await collect_rollout(
                self.predict,
                cast(Any, self.env),
                self.queue,
                served.config.schema_,
                config,
                job_id=job_id,
                partition_id=partition_id,
                num_envs=num_envs,
                horizon=horizon,
                version=v,
                heartbeat=heartbeat,
                normalization=served.config.normalization,
            )

    async def evaluate(
        self,
        tenant_id: str,
        session_id: str,
        *,
        episodes: int,
        version: int | None = None,
        deterministic: bool = True,
        session_tenant: str | None = None,
        seed: int | None = None,
        max_decisions: int = 100_000,
    ) -> EvalResult:
        with self._pinned(tenant_id, version) as v:
            return await run_evaluation(
                self.predict,
                cast(Any, self.env),
                tenant_id=tenant_id,
                session_id=session_id,
                session_tenant=session_tenant or tenant_id,
                episodes=episodes,
                version=v,
                deterministic=deterministic,
                seed=seed,
                max_decisions=max_decisions,
            )
