"""The Training Model Service (paper §4.1.2 Figure 4, Appendix A.6).

It holds every tenant's :class:`~joynexus.models.slots.TenantSlot` (action module,
optimizer, policy version) on top of the one resident backbone, and trains them from
leased Training Queue partitions:

* :meth:`TrainingModelService.train_job` derives a global batch plan from the job's
  ``sample_count`` and the tenant's ``microbatch_size`` (× ``epochs``), reads each
  microbatch with ``get_meta`` / ``get_data`` (task ``"train"``), checks every sample's
  tenant and schema annotations against the job, computes the task's loss (SFT: the
  head's supervised loss with padded chunk steps masked out; RL: PPO / GRPO /
  REINFORCE) and takes one optimizer step — one tenant version — per microbatch.
* :meth:`TrainingModelService.train_jobs` trains several leased jobs of different
  tenants together: their k-th microbatches share ONE grouped backbone forward.
* ``train_batch`` (custom algorithms), ``actor_forward`` (App. A.5), ``export_params``,
  ``save`` (or ``stage_save`` now, ``write_staged`` later) / ``restore``.

Public async methods are the API; the class holds no globals beyond its constructor
arguments, so the same class can be hosted as a Ray actor. Torch work runs in a worker
thread under the backbone's lock (:func:`~joynexus.services.tenancy.backbone_lock`), on
the device's cores (:func:`~joynexus.utils.affinity.on_device`): each step is
:func:`~joynexus.models.grouped_step.grouped_step` (losses in
:mod:`joynexus.services.train_batch`); a checkpoint snapshots tensors under the lock and
writes its files after. Each tenant's loss, clipping, AdamW step, version are its own.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from joynexus.control.job import TrainingJob
from joynexus.errors import ConflictError, NotFoundError
from joynexus.metrics.events import MetricsService
from joynexus.metrics.hooks import Instruments
from joynexus.metrics.usage import UsageMeter
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.checkpoints import payload as checkpoints
from joynexus.models.checkpoints.payload import (
    SlotSnapshot,
    TenantPayload,
    export_params,
    find_latest_checkpoint,
    init_slot_from,
    install_checkpoint,
    read_checkpoint,
    read_manifest,
    snapshot_slot,
)
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.execution.grouped_step import (
    GradientReduce,
    Outcome,
    StepTimes,
    TenantStep,
    grouped_step,
)
from joynexus.models.tenant.slots import StepResult, TenantSlot
from joynexus.queues.training import TrainingQueue
from joynexus.services.actor_forward import actor_forward
from joynexus.services.job_plan import JobPlan, Microbatch, TrainJobResult, plan_job
from joynexus.services.samples import FLOW_CHAIN
from joynexus.services.tenancy import TenantConfig, TenantInfo, backbone_lock, build_slot
from joynexus.services.train_batch import TrainBatch, microbatch_loss
from joynexus.services.wave import run_wave
from joynexus.utils.affinity import on_device
from joynexus.utils.clock import Clock, SystemClock

__all__ = ["TrainBatch", "TrainJobResult", "TrainingModelService"]


class TrainingModelService:
    """Trains tenant slots from Training Queue partitions (see module docstring).

    Args:
        base: The resident base model shared by every tenant.
        queue: The Training Queue the jobs' partitions live in.
        output_dir: Default checkpoint root; a tenant's relative ``output_dir`` is
            resolved against it.
        clock: Time source (checkpoint manifests record its wall time).
        metrics: Metrics Service for learning / system events (None: none emitted).
        usage: Usage meter: each step's shared forward split by row share plus each
            tenant's own head / optimizer time, and samples trained.
    """

    def __init__(
        self,
        base: ResidentBaseModel,
        queue: TrainingQueue,
        *,
        output_dir: Path,
        clock: Clock | None = None,
        metrics: MetricsService | None = None,
        usage: UsageMeter | None = None,
        tenant_memory_budget: int | None = None,
    ) -> None:
        self.base = base
        self.queue = queue
        self._instruments = Instruments(metrics, usage)
        self.output_dir = Path(output_dir)
        self.clock: Clock = clock or SystemClock()
        # tenant_memory_budget: bytes for all tenants' adapters, heads and optimizer
        # state together; add_tenant refuses a tenant that would exceed it.
        self._executor = GroupedExecutor(base, tenant_memory_budget=tenant_memory_budget)
        self._configs: dict[str, TenantConfig] = {}
        self._lock = backbone_lock(base)
        # Saves snapshotted by stage_save, not yet written: token → (step, snapshots, ledger).
        self._staged: dict[str, tuple[int, list[SlotSnapshot], dict[str, Any] | None]] = {}
        self._staged_seq = 0

    # --- tenants ---------------------------------------------------------------------

    async def add_tenant(self, config: TenantConfig) -> TenantInfo:
        """Create the tenant's slot (action module, optimizer, version 0).

        With ``config.init_checkpoint`` the slot starts from that checkpoint's weights.

        Raises:
            ConflictError: the tenant already exists here.
            InvalidRequestError: a bad tenant id or head config, or an init checkpoint
                that does not fit (SchemaMismatchError: another interface).
            CapacityError: the tenant would exceed the tenant memory budget.
        """
        if config.tenant_id in self._configs:
            raise ConflictError(
                f"tenant {config.tenant_id!r} already has a training slot",
                tenant_id=config.tenant_id,
            )
        slot = await asyncio.to_thread(build_slot, config, self.base)
        if config.init_checkpoint is not None:
            await asyncio.to_thread(init_slot_from, slot, config.init_checkpoint)
        self._executor.add_slot(slot)
        self._configs[config.tenant_id] = config
        return TenantInfo(config.tenant_id, slot.schema_signature, slot.policy_version)

    def tenant_ids(self) -> list[str]:
        return sorted(self._configs)

    async def remove_tenant(self, tenant_id: str) -> None:
        """Release the tenant's slot (action module, optimizer state, version).

        Checkpoints already written stay on disk; a later ``add_tenant`` + ``restore``
        brings the tenant back.

        Raises:
            NotFoundError: unknown tenant.
        """
        self._executor.remove_slot(tenant_id)
        self._configs.pop(tenant_id, None)

    def policy_version(self, tenant_id: str) -> int:
        """The tenant's current (training) policy version.

        Raises:
            NotFoundError: unknown tenant.
        """
        return self._executor.slot(tenant_id).policy_version

    def config(self, tenant_id: str) -> TenantConfig:
        self._executor.slot(tenant_id)
        return self._configs[tenant_id]

    def slot(self, tenant_id: str) -> TenantSlot:
        """The tenant's slot (in-process use: tests, benchmarks)."""
        return self._executor.slot(tenant_id)

    # --- train_job ---------------------------------------------------------------------

    async def train_job(
        self, job: TrainingJob, *, heartbeat: Callable[[], None] | None = None
    ) -> TrainJobResult:
        """Train the tenant on a leased job's partition (App. A.6).

        Args:
            job: The leased job (``job_id, tenant_id, partition_id, task_type,
                sample_count``).
            heartbeat: Called between microbatches (renew the actor's lease).

        Raises:
            NotFoundError: unknown tenant.
            PartitionNotFoundError: the partition does not exist.
            PermissionDeniedError: a sample of another tenant in the partition.
            SchemaMismatchError: a sample (or the job) with another schema signature.
            ConflictError: fewer ready samples than the job's ``sample_count``.
            InvalidRequestError: RL on a non-Gaussian head, or an empty job.
        """
        results = await self.train_jobs([job], heartbeat=heartbeat)
        return results[0]

    async def train_jobs(
        self,
        jobs: Sequence[TrainingJob],
        *,
        heartbeat: Callable[[], None] | None = None,
        heartbeats: Mapping[str, Callable[[], None]] | None = None,
    ) -> list[TrainJobResult]:
        """Train several leased jobs, sharing backbone forwards between tenants.

        When it groups: jobs of DIFFERENT tenants advance in lock step, and for each
        microbatch index k the k-th microbatches of every job that still has one go
        through ONE grouped backbone forward (all tenants of this service share one
        backbone, so their prefixes are always compatible); each tenant then computes
        its own loss and takes its own optimizer step. Jobs with fewer microbatches
        simply drop out of later forwards. Several jobs of the SAME tenant never share
        a forward: they run one after another, in the given order (a tenant's k-th
        step must see the parameters of its (k-1)-th). Results equal training each
        job alone up to floating-point reassociation in the backbone (fp32: ~1e-6).

        If a microbatch fails validation the call raises at once; the jobs' earlier
        microbatches have already updated their tenants (the caller fails the jobs).
        :meth:`train_jobs_isolated` instead keeps the other jobs going.

        Args:
            jobs: Leased jobs.
            heartbeat: Called between microbatch indices.
            heartbeats: Per-job heartbeat callables (by ``job_id``), also called then.

        Returns:
            One :class:`TrainJobResult` per job, in the order given.
        """
        outcomes = await self._train(jobs, heartbeat, heartbeats or {}, isolate=False)
        results: list[TrainJobResult] = []
        for outcome in outcomes:
            if isinstance(outcome, Exception):  # never: not isolating, errors propagate
                raise outcome
            results.append(outcome)
        return results

    async def train_jobs_isolated(
        self,
        jobs: Sequence[TrainingJob],
        *,
        heartbeat: Callable[[], None] | None = None,
    ) -> list[TrainJobResult | Exception]:
        """:meth:`train_jobs`, where one job's failure never stops the others.

        A job whose plan, microbatch read / validation, or loss and step fails leaves
        the group and its exception is returned in its place (its earlier microbatches
        have updated its tenant, as when a single job fails midway); the other jobs go
        on with their grouped forwards. Only a failure of the shared backbone forward
        itself fails every job of that step. Exceptions are returned, not raised, so
        the call also works through an actor proxy (``heartbeat`` stays with the
        caller there).

        Returns:
            Per job, in the order given, its :class:`TrainJobResult` or its exception.
        """
        return await self._train(jobs, heartbeat, {}, isolate=True)

    async def _train(
        self,
        jobs: Sequence[TrainingJob],
        heartbeat: Callable[[], None] | None,
        heartbeats: Mapping[str, Callable[[], None]],
        *,
        isolate: bool,
    ) -> list[TrainJobResult | Exception]:
        plans: list[JobPlan | Exception] = []
        for job in jobs:
            try:
                plans.append(await self._plan(job))
            except Exception as error:
                if not isolate:
                    raise
                plans.append(error)
        waves: list[list[JobPlan]] = []
        for plan in plans:
            if isinstance(plan, Exception):
                continue
            for wave in waves:
                if all(p.job.tenant_id != plan.job.tenant_id for p in wave):
                    wave.append(plan)
                    break
            else:
                waves.append([plan])
        for wave in waves:
            await self._run_wave(wave, heartbeat, heartbeats, isolate)
        out: list[TrainJobResult | Exception] = []
        for plan in plans:
            if isinstance(plan, Exception):
                out.append(plan)
            else:
                out.append(plan.error if plan.error is not None else plan.result())
        return out

    async def _plan(self, job: TrainingJob) -> JobPlan:
        config = self._configs.get(job.tenant_id)
        if config is None:
            raise NotFoundError(
                f"job {job.job_id!r}: tenant {job.tenant_id!r} has no training slot; "
                f"known: {self.tenant_ids()}",
                job_id=job.job_id,
                tenant_id=job.tenant_id,
            )
        return await plan_job(job, config, self._executor.slot(job.tenant_id), self.queue)

    async def _run_wave(
        self,
        wave: list[JobPlan],
        heartbeat: Callable[[], None] | None,
        heartbeats: Mapping[str, Callable[[], None]],
        isolate: bool = False,
    ) -> None:
        def beat(active: list[JobPlan]) -> None:
            if heartbeat is not None:
                heartbeat()
            for plan in active:
                one = heartbeats.get(plan.job.job_id)
                if one is not None:
                    one()

        await run_wave(self.queue, wave, self._grouped_step, beat, isolate=isolate)

    def _grouped_step(self, items: list[Microbatch], isolate: bool = False) -> list[Outcome]:
        """The microbatches' grouped step (:func:`~joynexus.models.grouped_step.grouped_step`)
        under the backbone lock, then its metering."""
        times = StepTimes()
        with on_device():
            outcomes = grouped_step(
                self._tenant_steps(items),
                forward=self._executor.shared_forward,
                lock=self._lock,
                reduce=self._gradient_reduce(),
                isolate=isolate,
                times=times,
                sync=self._sync_for_timing,
            )
        if self._instruments.enabled:
            self._instruments.training_step(times.rows, times.shared_s, times.own_s)
            for it, outcome in zip(items, outcomes, strict=True):
                if not isinstance(outcome, Exception):
                    step = outcome[0]
                    self._instruments.learning_step(
                        it.slot.tenant_id, step.policy_version, step.loss, step.grad_norm
                    )
        return outcomes

    def _tenant_steps(self, items: list[Microbatch]) -> list[TenantStep]:
        """Each microbatch as its tenant's part of the step (a data-parallel rank keeps
        its share of the rows)."""
        return [TenantStep(it.slot, it.batch, microbatch_loss(it)) for it in items]

    def _gradient_reduce(self) -> GradientReduce | None:
        """The gradient-reduce hook of the step (one process: none)."""
        return None

    def _sync_for_timing(self) -> None:
        # Async CUDA kernels: else one tenant's queued work is billed to the next one.
        if self._instruments.enabled and self.base.device.type == "cuda":
            torch.cuda.synchronize(self.base.device)

    # --- custom algorithms ----------------------------------------------------------------

    async def train_batch(self, tenant_id: str, batch: TrainBatch) -> StepResult:
        """One update of ``tenant_id`` on a caller-built batch (custom algorithms).

        Every field is checked (:meth:`TrainBatch.check`) before the backbone runs, so
        a refused batch never steps the optimizer.

        Raises:
            NotFoundError: unknown tenant.
            SchemaMismatchError: observations that do not fit the tenant's schema, or a
                field whose shape does not fit the batch.
            InvalidRequestError: missing actions / advantages / old log-probs for the
                loss, or NaN / inf values.
        """
        config = self.config(tenant_id)
        slot = self._executor.slot(tenant_id)
        obs = batch.observations
        obs.validate(slot.schema)
        batch.check()
        data: dict[str, Any] = {}
        if batch.loss == "sft":
            if batch.action_is_pad is not None:
                data["action_is_pad"] = np.asarray(batch.action_is_pad, dtype=bool)
        else:
            data["advantages"] = batch.advantages
            if batch.old_log_probs is not None:
                data["log_probs"] = batch.old_log_probs
            if batch.returns is not None:
                data["returns"] = batch.returns
            if batch.flow_chain is not None:
                data[FLOW_CHAIN] = batch.flow_chain
        item = Microbatch(batch.loss, config, slot, obs, data)
        outcomes = await asyncio.to_thread(self._grouped_step, [item])
        outcome = outcomes[0]
        if isinstance(outcome, Exception):  # never: not isolating, errors propagate
            raise outcome
        return outcome[0]

    # --- actor forward (App. A.5) ---------------------------------------------------------

    async def actor_forward(self, job: TrainingJob) -> None:
        """Attach ``actor_log_probs`` / ``actor_values`` of the behaviour actions under the
        tenant's current actor to every sample of the job's partition
        (:func:`~joynexus.services.actor_forward.actor_forward`).

        Raises:
            NotFoundError, PermissionDeniedError, SchemaMismatchError, ConflictError,
            InvalidRequestError: as :meth:`train_job`.
        """
        plan = await self._plan(job)
        await actor_forward(
            self.queue,
            plan,
            forward=self._executor.shared_forward,
            lock=self._lock,
            instruments=self._instruments,
        )

    # --- parameters and checkpoints ---------------------------------------------------------

    async def export_params(self, tenant_id: str) -> TenantPayload:
        """A CPU snapshot of the tenant's action module (+ critic): never base weights."""
        slot = self._executor.slot(tenant_id)

        def snap() -> TenantPayload:
            with on_device(), self._lock:
                return export_params(slot)

        return await asyncio.to_thread(snap)

    def checkpoint_root(self, tenant_id: str) -> Path:
        """Directory holding ``<tenant>/step_<n>`` for this tenant."""
        out = self.config(tenant_id).output_dir
        return out if out.is_absolute() else self.output_dir / out

    async def save(
        self,
        step: int,
        tenant_ids: Sequence[str] | None = None,
        include_optim: bool = True,
        ledger: Mapping[str, Any] | None = None,
    ) -> list[Path]:
        """Write ``<output_dir>/<tenant>/step_<step>/`` for each tenant (atomically).

        Args:
            step: The step in the directory name (the policy version, by convention).
            tenant_ids: Whose slots (default: every tenant).
            include_optim: Also write the optimizer state (to resume training).
            ledger: Recorded in each manifest with the weights (see
                :func:`~joynexus.models.checkpoints.payload.write_checkpoint`).

        Raises:
            NotFoundError: an unknown tenant.
            ConflictError: that checkpoint already exists.
        """
        return await self.write_staged(
            await self.stage_save(step, tenant_ids, include_optim=include_optim, ledger=ledger)
        )

    async def stage_save(
        self,
        step: int,
        tenant_ids: Sequence[str] | None = None,
        include_optim: bool = True,
        ledger: Mapping[str, Any] | None = None,
    ) -> str:
        """:meth:`save`'s first half: snapshot the slots now (in memory), write them with
        :meth:`write_staged` later (or :meth:`discard_staged`). The tenants may train on
        once it returns; the checkpoint keeps these weights. Returns the save's token.

        Raises:
            NotFoundError: an unknown tenant.
        """
        ids = list(tenant_ids) if tenant_ids is not None else self.tenant_ids()
        slots = [self._executor.slot(t) for t in ids]

        def snap() -> list[SlotSnapshot]:
            # In-memory copies under the lock; the files are written after it is
            # released, so no tenant's predict or step waits for the disk.
            with on_device(), self._lock:
                return [snapshot_slot(s, include_optim=include_optim) for s in slots]

        snapshots = await asyncio.to_thread(snap)
        self._staged_seq += 1
        token = f"save-{self._staged_seq}"
        self._staged[token] = (step, snapshots, dict(ledger) if ledger is not None else None)
        return token

    async def write_staged(self, token: str) -> list[Path]:
        """Write a staged save's checkpoints (see :meth:`save`); the token is used up.

        Raises:
            NotFoundError: no staged save of that token (written or discarded already).
            ConflictError: that checkpoint already exists.
        """
        try:
            step, snapshots, ledger = self._staged.pop(token)
        except KeyError:
            raise NotFoundError(f"no staged save {token!r}") from None

        def write() -> list[Path]:
            return [
                checkpoints.write_checkpoint(
                    snap,
                    self.checkpoint_root(snap.tenant_id),
                    step,
                    clock=self.clock.wall,
                    ledger=ledger,
                )
                for snap in snapshots
            ]

        return await asyncio.to_thread(write)

    async def discard_staged(self, token: str) -> None:
        """Drop a staged save without writing it (no error if it is gone)."""
        self._staged.pop(token, None)

    def latest_checkpoint(self, tenant_id: str) -> Path | None:
        """The tenant's checkpoint with the highest step, or None."""
        return find_latest_checkpoint(self.checkpoint_root(tenant_id), tenant_id)

    async def prune_checkpoints(
        self, tenant_id: str, *, keep_last: int = 2, keep_every: int = 0
    ) -> list[Path]:
        """Delete the tenant's older checkpoints; returns the deleted directories.

        Args:
            keep_last: The newest checkpoints always kept (at least 1).
            keep_every: Also keep steps that are multiples of it (0: none).
        """

        def prune() -> list[Path]:
            steps = checkpoints.checkpoint_steps(self.checkpoint_root(tenant_id), tenant_id)
            doomed = [
                path
                for step, path in steps[: -max(keep_last, 1)]
                if not (keep_every > 0 and step % keep_every == 0)
            ]
            for path in doomed:
                shutil.rmtree(path, ignore_errors=True)
            return doomed

        return await asyncio.to_thread(prune)

    def checkpoint_ledger(self, tenant_id: str) -> dict[str, Any]:
        """The ledger recorded with the tenant's latest checkpoint (empty without one)."""
        latest = self.latest_checkpoint(tenant_id)
        return {} if latest is None else dict(read_manifest(latest).ledger)

    async def restore(self, tenant_id: str, checkpoint: Path | None = None) -> int:
        """Load the tenant's latest checkpoint (or ``checkpoint``); returns its version.

        Raises:
            NotFoundError: no checkpoint for the tenant.
            InvalidRequestError / SchemaMismatchError: a checkpoint that does not fit.
        """
        slot = self._executor.slot(tenant_id)
        path = checkpoint if checkpoint is not None else self.latest_checkpoint(tenant_id)
        if path is None:
            raise NotFoundError(
                f"tenant {tenant_id!r} has no checkpoint under "
                f"{self.checkpoint_root(tenant_id) / tenant_id}",
                tenant_id=tenant_id,
            )

        def load() -> int:
            loaded = read_checkpoint(slot, path)  # files read and verified without the lock
            with self._lock:
                install_checkpoint(slot, loaded)
                return slot.policy_version

        return await asyncio.to_thread(load)
