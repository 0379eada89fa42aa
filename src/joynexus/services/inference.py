"""The Inference Model Service (paper §4.1.2 Figure 4, §4.3).

``predict`` requests of every tenant enter one :class:`InferenceQueue`; its group
batcher forms batches of requests with the same frozen-prefix key (one backbone, so
every tenant here is compatible) and one worker-thread call runs ONE grouped backbone
forward and decodes each request with its own tenant's serving slot at the version the
request names (:class:`~joynexus.services.serving.ServingStates`). Training publishes
new versions with ``load_weights``; an evaluation or rollout ``pinned`` to version v
keeps getting v while v+1 lands.

``rollout`` and ``evaluate`` are the environment loops of
:mod:`joynexus.services.rollout` composed over ``predict`` and the Environment Service.

Units: callers and envs speak env units. A tenant with normalization stats (SFT on a
dataset) computes in normalized units, so ``predict`` normalizes the state before the
backbone and head and un-normalizes the actions after them; rollouts store the
normalized state and actions the tenant trains on.

One request cannot hold the shared backbone: a ``predict`` of more rows than C
(``tenant_batch_rows``, at most the batcher's B) is split into C-row pieces (one
version pinned for all of them), each its own queue request, answered together; the
fair Inference Queue puts at most C rows of one tenant into a batch and starts each
batch's turns with the tenant served longest ago, so another tenant's request waits at
most one batch in which the large predict (or a flood) holds C rows. Every request
carries a queue deadline (``request_deadline_s``, 504 ``deadline_exceeded`` when it
passes before the request runs).

Non-finite numbers never leave the service: ``load_weights`` refuses a tensor holding
NaN or inf (naming it), and a prediction that comes out non-finite (finite but huge
inputs can overflow) fails that request alone with an
:class:`~joynexus.errors.InvalidRequestError`; the other requests of its grouped batch
get their answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import Literal

import numpy as np
import torch

from joynexus.errors import InvalidRequestError, SchemaMismatchError, ServiceUnavailableError
from joynexus.metrics.events import MetricsService
from joynexus.metrics.hooks import Instruments
from joynexus.metrics.usage import UsageMeter
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.payload import TenantPayload
from joynexus.models.execution.grouped import (
    GroupedExecutor,
    InferenceResult,
    ServeRequest,
    StageTimes,
)
from joynexus.models.tenant.slots import TenantSlot
from joynexus.queues.inference import InferenceQueue, InferenceQueueMetrics, InferenceRequest
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.rollout import (
    EvalResult,
    PredictResult,
    RolloutConfig,
    RolloutStats,
    collect_rollout,
    run_evaluation,
)
from joynexus.services.serving import ServingStates, env_actions, in_model_units
from joynexus.services.tenancy import TenantConfig, backbone_lock
from joynexus.utils.affinity import on_device
from joynexus.utils.clock import Clock

__all__ = [
    "EvalResult",
    "InferenceModelService",
    "PredictResult",
    "RolloutConfig",
    "RolloutStats",
]


def check_finite_tensors(named_tensors: Mapping[str, torch.Tensor]) -> None:
    """Refuse weights holding NaN or inf: served, they would answer NaN actions.

    Raises:
        InvalidRequestError: naming the first non-finite tensor.
    """
    for name, tensor in named_tensors.items():
        if (
            isinstance(tensor, torch.Tensor)
            and tensor.is_floating_point()
            and not bool(torch.isfinite(tensor).all())
        ):
            bad = int((~torch.isfinite(tensor)).sum())
            raise InvalidRequestError(
                f"named_tensors[{name!r}]: {bad} of {tensor.numel()} values are NaN or "
                "infinite; load_weights publishes finite tensors only",
                field="named_tensors",
                tensor=name,
            )


def _check_finite_prediction(tenant_id: str, result: PredictResult) -> None:
    for name, value in (
        ("actions", result.actions),
        ("log_probs", result.log_probs),
        ("values", result.values),
    ):
        if value is not None and not bool(np.isfinite(value).all()):
            raise InvalidRequestError(
                f"the policy of tenant {tenant_id!r} (version {result.policy_version}) "
                f"predicted NaN or infinite {name} for these observations: inputs far "
                "outside the range it was trained on (e.g. state values near the float32 "
                "limit) overflow, or its weights diverged; nothing was returned",
                field=name,
                reason="non_finite_prediction",
                policy_version=result.policy_version,
            )


class InferenceModelService:
    """Serves every tenant's policy through the Inference Queue (see module docstring).

    Args:
        base: The resident base model.
        env: The Environment Service (rollouts and evaluations).
        queue: The Training Queue rollouts write to.
        max_batch_size: B of the group batcher, in samples.
        max_wait_s: T of the group batcher.
        clock: Time source of the batcher.
        metrics: Metrics Service for system / learning events (None: none emitted).
        usage: Usage meter: each grouped batch's seconds by row share, request counts.
        request_deadline_s: Longest a predict (each of its pieces) may wait in the
            Inference Queue before it fails with ``deadline_exceeded``; None: no limit.
        tenant_batch_rows: C, the most rows of one tenant in one batch: a larger
            predict runs as C-row pieces (None, or more than B: B).
    """

    def __init__(
        self,
        base: ResidentBaseModel,
        env: EnvironmentService,
        queue: TrainingQueue,
        *,
        max_batch_size: int = 128,
        max_wait_s: float = 0.005,
        clock: Clock | None = None,
        metrics: MetricsService | None = None,
        usage: UsageMeter | None = None,
        request_deadline_s: float | None = 60.0,
        tenant_batch_rows: int | None = None,
    ) -> None:
        if tenant_batch_rows is not None and tenant_batch_rows < 1:
            raise InvalidRequestError(f"tenant_batch_rows must be ≥ 1, got {tenant_batch_rows}")
        self.base = base
        self._piece_rows = min(max_batch_size, tenant_batch_rows or max_batch_size)
        self._deadline_s = request_deadline_s
        self.env = env
        self.queue = queue
        self._instruments = Instruments(metrics, usage)
        self._in_flight = 0
        self._lock = backbone_lock(base)
        self.states = ServingStates(base, build_guard=self._build_guard)
        # One lock per batch: the executor takes the backbone's own lock.
        self._executor = GroupedExecutor(base, lock=self._lock)
        self._compat_key = base.prefix_key()
        self.inference_queue = InferenceQueue(
            self._run_batch,
            max_batch_size=max_batch_size,
            max_wait_s=max_wait_s,
            clock=clock,
            max_tenant_samples=self._piece_rows,
        )

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        await self.inference_queue.start()

    async def stop(self) -> None:
        await self.inference_queue.stop()

    async def __aenter__(self) -> InferenceModelService:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def metrics(self) -> InferenceQueueMetrics:
        """The Inference Queue's batching metrics."""
        return self.inference_queue.metrics

    @property
    def in_flight(self) -> int:
        """Predict calls accepted and not yet answered (queued or running)."""
        return self._in_flight

    # --- tenants and versions ----------------------------------------------------------

    async def add_tenant(self, config: TenantConfig, payload: TenantPayload | None = None) -> None:
        """Serve a tenant at version 0, or at ``payload``'s version with its weights.

        Raises:
            ConflictError: already served.
            InvalidRequestError / SchemaMismatchError: a payload that does not fit.
        """
        await asyncio.to_thread(self._locked, self.states.add_tenant, config, payload)

    async def remove_tenant(self, tenant_id: str) -> None:
        """Stop serving the tenant (every held version is freed).

        Raises:
            NotFoundError: the tenant is not served here.
        """
        await asyncio.to_thread(self._locked, self.states.remove_tenant, tenant_id)

    def _locked(self, fn: Callable[..., None], *args: object) -> None:
        with self._lock:
            fn(*args)

    @contextmanager
    def _build_guard(self) -> Iterator[None]:
        # A new slot's initialisation forks the process's RNG: never beside a step. A
        # priority acquirer, like a predict batch: a training step lets it in at its
        # next phase boundary instead of after the whole step (otherwise an SFT
        # tenant's publication, running behind its next update, waits that update out
        # and then holds the lock when the one after wants to start). Safe between
        # phases for the same reason a predict is: the fork restores the step's RNG
        # state and the build touches no training state. A publication that writes
        # into a freed slot takes no lock at all (ServingStates.publish).
        with on_device(), self._lock.priority():
            yield

    async def load_weights(
        self, tenant_id: str, version: int, named_tensors: Mapping[str, torch.Tensor]
    ) -> None:
        """Publish ``version`` of the tenant (names, shapes and dtypes validated).

        Raises:
            NotFoundError: unknown tenant.
            ConflictError: a version older than the one served.
            InvalidRequestError: tensors that do not fit the tenant's action module, or
                that hold NaN or inf (the message names the tensor).
        """
        check_finite_tensors(named_tensors)
        start = time.perf_counter()
        await asyncio.to_thread(self.states.publish, tenant_id, version, named_tensors)
        self._instruments.weight_sync(tenant_id, time.perf_counter() - start, version)

    def current_policy_version(self, tenant_id: str) -> int:
        """The latest published version of the tenant."""
        return self.states.latest(tenant_id)

    def pinned(self, tenant_id: str, version: int | None = None) -> AbstractContextManager[int]:
        """Resolve the tenant's version once (default: latest) and keep it served until
        the ``with`` block exits."""
        return self.states.pinned(tenant_id, version)

    def serving_slot(self, tenant_id: str, version: int | None = None) -> TenantSlot:
        return self.states.slot(tenant_id, version)

    # --- predict -----------------------------------------------------------------------

    async def predict(
        self,
        observations: ObservationBatch,
        tenant_id: str,
        policy_version: int | None = None,
        *,
        mode: Literal["mean", "sample"] = "mean",
        session_id: str = "predict",
    ) -> PredictResult:
        """Actions for ``observations`` from the tenant's policy, via the Inference Queue.

        State in and actions out are in env units: a tenant with normalization stats
        gets its state normalized before the head and its actions un-normalized after
        it (``log_probs`` stay those of the head's normalized sample).

        Args:
            observations: A batch in the tenant's schema (env units).
            tenant_id: The tenant.
            policy_version: A held version (pinned or latest); None = latest at run time.
            mode: ``"mean"`` (deterministic) or ``"sample"`` (Gaussian draw + log-probs).
            session_id: The environment session / API call the request comes from.

        Raises:
            NotFoundError: unknown tenant.
            ConflictError: ``policy_version`` is not served.
            SchemaMismatchError: observations that do not fit the tenant's schema.
            InvalidRequestError: the prediction came out NaN or inf (only this request
                fails; the others of its batch are answered).
            ServiceUnavailableError: the service is not started.
        """
        admitted = time.perf_counter()
        # Resolved and validated ONCE, here: the batch path trusts the request's slot.
        slot = self.states.slot(tenant_id, policy_version)
        observations.validate(slot.schema)
        if not self.inference_queue.running:
            raise ServiceUnavailableError(
                "the inference model service is not running; call start() or use 'async with'"
            )
        rows, step = observations.batch_size, self._piece_rows
        # Split: one version for every piece, even if a new one is published meanwhile.
        pin = self.states.pinned(tenant_id, policy_version) if rows > step else nullcontext()
        with pin as pinned:
            if pinned is not None:
                policy_version, slot = pinned, self.states.slot(tenant_id, pinned)
            futures: list[asyncio.Future[InferenceResult]] = []
            try:
                for i in range(0, rows, step):
                    piece = observations if rows <= step else _rows(observations, i, i + step)
                    futures.append(
                        self._enqueue(piece, tenant_id, policy_version, mode, session_id, slot)
                    )
            except BaseException:
                for f in futures:  # e.g. the queue filled up: free what was queued
                    f.cancel()
                raise
            self._instruments.stage("admission", time.perf_counter() - admitted)
            self._instruments.request(tenant_id)
            result = await self._gather(futures)
        out = PredictResult(
            actions=env_actions(result.actions, slot.normalization),
            log_probs=result.log_probs,
            values=result.values,
            policy_version=result.policy_version,
            chain=result.chain,
        )
        _check_finite_prediction(tenant_id, out)
        return out

    def _enqueue(
        self,
        observations: ObservationBatch,
        tenant_id: str,
        policy_version: int | None,
        mode: Literal["mean", "sample"],
        session_id: str,
        slot: TenantSlot,
    ) -> asyncio.Future[InferenceResult]:
        request = InferenceRequest(
            tenant_id=tenant_id,
            session_id=session_id,
            schema_signature=slot.schema_signature,
            policy_version=policy_version,
            observation=ServeRequest(
                tenant_id=tenant_id,
                observation=in_model_units(observations, slot.normalization),
                policy_version=policy_version,
                mode=mode,
                slot=slot,
                enqueued_at=time.perf_counter(),
            ),
            num_samples=observations.batch_size,
            compat_key=self._compat_key,
            deadline_s=self._deadline_s,
        )
        return self.inference_queue.enqueue(request)

    async def _gather(self, futures: list[asyncio.Future[InferenceResult]]) -> InferenceResult:
        self._in_flight += 1
        try:
            results = list(await asyncio.gather(*futures))
        except BaseException:
            for f in futures:  # a failed piece frees the others' queue slots
                f.cancel()
            raise
        finally:
            self._in_flight -= 1
        return results[0] if len(results) == 1 else _concat(results)

    async def _run_batch(self, requests: Sequence[InferenceRequest]) -> list[InferenceResult]:
        serve = [r.observation for r in requests]
        if self._instruments.enabled:
            dispatched = time.perf_counter()
            waited = sum(dispatched - r.enqueued_at for r in serve)
            self._instruments.stage("queue_wait", waited, len(serve))
        # A lone request: nothing queued behind it and no other predict awaiting.
        alone = len(serve) == 1 and len(self.inference_queue) == 0 and self._in_flight <= 1
        return await asyncio.to_thread(self._run, serve, alone)

    def _run(self, serve: list[ServeRequest], alone: bool = False) -> list[InferenceResult]:
        times = StageTimes()
        try:
            with on_device():
                return self._executor.run_requests(
                    serve, resolve_slot=self.states.slot, times=times, alone=alone
                )
        finally:
            if self._instruments.enabled:
                rows: dict[str, int] = {}
                for r in serve:
                    rows[r.tenant_id] = rows.get(r.tenant_id, 0) + r.observation.batch_size
                # Device work only: the lock wait is not the backbone's time.
                self._instruments.inference_batch(rows, times.device_s)
                self._instruments.batch_stages(
                    {
                        "lock_wait": times.lock_wait_s,
                        "canonicalize": times.canonicalize_s,
                        "backbone": times.backbone_s,
                        "head": times.head_s,
                    }
                )

    # --- environment loops ---------------------------------------------------------------

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
        """Collect ``horizon`` decisions × ``num_envs`` at ``version`` into the partition.

        The version stays pinned for the whole rollout; ``heartbeat`` is called every
        decision (the producer's lease).

        Raises:
            SchemaMismatchError: ``config.schema_signature`` is not the tenant's.
            ConflictError: ``version`` is not served.
            NotFoundError / PermissionDeniedError: the session is unknown or not the
                tenant's.
        """
        with self.pinned(config.tenant_id, version) as v:
            slot = self.states.slot(config.tenant_id, v)
            if config.schema_signature != slot.schema_signature:
                raise SchemaMismatchError(
                    f"rollout of tenant {config.tenant_id!r}: schema signature "
                    f"{config.schema_signature!r} is not the tenant's {slot.schema_signature!r}",
                    field="schema_signature",
                )
            stats = await collect_rollout(
                self.predict,
                self.env,
                self.queue,
                slot.schema,
                config,
                job_id=job_id,
                partition_id=partition_id,
                num_envs=num_envs,
                horizon=horizon,
                version=v,
                heartbeat=heartbeat,
                normalization=slot.normalization,
            )
            if stats.episode_returns:
                mean_return = sum(stats.episode_returns) / len(stats.episode_returns)
                self._instruments.rollout(config.tenant_id, v, mean_return, stats.success_rate)
            return stats

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
        """Read-only evaluation of ``tenant_id``'s policy, resolved ONCE and pinned.

        Args:
            tenant_id: The evaluated tenant.
            session_id: An env session owned by ``session_tenant`` (default ``tenant_id``).
            episodes: Episodes to finish.
            version: Version to evaluate (default: latest at start).
            deterministic: Policy mean (True) or sampled actions.
            session_tenant: The evaluator tenant that owns the session.
            seed: Env reset seed.
            max_decisions: Safety bound on decisions.
        """
        with self.pinned(tenant_id, version) as v:
            result = await run_evaluation(
                self.predict,
                self.env,
                tenant_id=tenant_id,
                session_id=session_id,
                session_tenant=session_tenant or tenant_id,
                episodes=episodes,
                version=v,
                deterministic=deterministic,
                seed=seed,
                max_decisions=max_decisions,
            )
        self._instruments.evaluation(tenant_id, v, result.mean_return, result.success_rate)
        return result


def _rows(obs: ObservationBatch, start: int, stop: int) -> ObservationBatch:
    """Rows ``start:stop`` of a batch (views, no copies)."""
    return ObservationBatch(
        cameras={k: v[start:stop] for k, v in obs.cameras.items()},
        state=obs.state[start:stop],
        instructions=obs.instructions[start:stop],
        actions=None if obs.actions is None else obs.actions[start:stop],
    )


def _concat(parts: list[InferenceResult]) -> InferenceResult:
    """The pieces of one split request, joined back in row order."""

    def cat(arrays: list[np.ndarray | None]) -> np.ndarray | None:
        return None if arrays[0] is None else np.concatenate([a for a in arrays if a is not None])

    first = parts[0]
    return InferenceResult(
        tenant_id=first.tenant_id,
        policy_version=first.policy_version,
        actions=np.concatenate([p.actions for p in parts]),
        log_probs=cat([p.log_probs for p in parts]),
        values=cat([p.values for p in parts]),
        chain=cat([p.chain for p in parts]),
    )
