"""The fake Training Model Service (see :mod:`tests.fakes.plane`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from joynexus.control.job import TaskType, TrainingJob
from joynexus.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    SchemaMismatchError,
)
from joynexus.models.checkpoints.payload import (
    MANIFEST_FILE,
    CheckpointManifest,
    TenantPayload,
    checkpoint_dir,
    find_latest_checkpoint,
    read_manifest,
)
from joynexus.models.schema import DataSchema
from joynexus.models.tenant.slots import StepResult
from joynexus.queues.meta import BatchMeta
from joynexus.queues.training import TrainingQueue
from joynexus.services.samples import as_numpy, observation_fields
from joynexus.services.tenancy import TenantConfig, TenantInfo
from joynexus.services.training import TrainBatch, TrainJobResult
from joynexus.utils.clock import Clock, SystemClock
from tests.fakes.base import (
    _STEP_DIR,
    ACTOR_FORWARD_TASK,
    OPTIMIZER_FILE,
    STATE_FILE,
    TRAIN_TASK,
    WEIGHT,
    WEIGHT_SIZE,
    FakeBase,
    _thread_hop,
)


@dataclass
class _Slot:
    config: TenantConfig
    signature: str
    version: int = 0
    weights: np.ndarray = field(default_factory=lambda: np.zeros(WEIGHT_SIZE, np.float32))
    #: Job ids whose updates these weights contain, in order ("train_batch" for a
    #: custom update).
    applied: list[str] = field(default_factory=list)

    @property
    def schema(self) -> DataSchema:
        return self.config.schema_


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class FakeTrainingService:
    """The Training Model Service's contract without a model (see module docstring).

    Args:
        base: The (fake) resident base model: signatures and the manifest's base id.
        queue: The real Training Queue the jobs' partitions live in.
        output_dir: Default checkpoint root (a tenant's relative ``output_dir`` is
            resolved against it, like the real service).
        clock: Manifest creation times.

    Hooks (all optional; a test sets them):
        on_step: ``await``-ed after each microbatch's version step (the real step runs in
            a worker thread: the loop runs meanwhile, and sees the new version).
        on_saved: ``await``-ed after a checkpoint is on disk, before ``save`` returns.
        fail_job: Returns an exception to fail that job's training with (after its
            partition was validated), or None.
        write_text: The file writer of checkpoints (a test injects a full disk by
            raising ``OSError(ENOSPC)`` from it).
    """

    def __init__(
        self,
        base: FakeBase,
        queue: TrainingQueue,
        *,
        output_dir: Path,
        clock: Clock | None = None,
    ) -> None:
        self.base = base
        self.queue = queue
        self.output_dir = Path(output_dir)
        self.clock: Clock = clock or SystemClock()
        self._slots: dict[str, _Slot] = {}
        self.on_step: Callable[[TrainingJob, int], Awaitable[None]] | None = None
        self.on_saved: Callable[[str, int, dict[str, Any]], Awaitable[None]] | None = None
        self.fail_job: Callable[[TrainingJob], Exception | None] | None = None
        self.write_text: Callable[[Path, str], object] = Path.write_text
        #: (tenant, job id, version after) of every job trained to its end.
        self.trained: list[tuple[str, str, int]] = []
        #: stage_save's copies of slots, by token, until written or discarded.
        self._staged: dict[str, tuple[int, list[_Slot], bool, dict[str, Any]]] = {}
        self._staged_seq = 0

    # --- tenants -------------------------------------------------------------------

    def _slot(self, tenant_id: str) -> _Slot:
        slot = self._slots.get(tenant_id)
        if slot is None:
            raise NotFoundError(
                f"tenant {tenant_id!r} has no action module here; known: {self.tenant_ids()}",
                tenant_id=tenant_id,
            )
        return slot

    async def add_tenant(self, config: TenantConfig) -> TenantInfo:
        if config.tenant_id in self._slots:
            raise ConflictError(
                f"tenant {config.tenant_id!r} already has a training slot",
                tenant_id=config.tenant_id,
            )
        await _thread_hop()
        if config.tenant_id in self._slots:  # the real build runs in a thread too
            raise ConflictError(f"tenant {config.tenant_id!r} already has a training slot")
        slot = _Slot(config, self.base.signature_for(config.schema_))
        self._slots[config.tenant_id] = slot
        return TenantInfo(config.tenant_id, slot.signature, slot.version)

    async def remove_tenant(self, tenant_id: str) -> None:
        self._slot(tenant_id)
        del self._slots[tenant_id]

    def tenant_ids(self) -> list[str]:
        return sorted(self._slots)

    def policy_version(self, tenant_id: str) -> int:
        return self._slot(tenant_id).version

    def config(self, tenant_id: str) -> TenantConfig:
        return self._slot(tenant_id).config

    def lose_slots(self) -> None:
        """Ray re-created the role after its node was lost: the new process holds no
        tenant slot until the Master's restart rebuilds them (tests)."""
        self._slots.clear()

    # --- training --------------------------------------------------------------------

    def _fields(self, job: TrainingJob, slot: _Slot, available: set[str]) -> list[str]:
        fields = [*observation_fields(slot.schema), "actions"]
        algo = slot.config.algorithm
        if job.task_type is TaskType.SFT:
            if "action_is_pad" in available:
                fields.append("action_is_pad")
            return fields
        if algo.name == "sft":
            raise InvalidRequestError(
                f"job {job.job_id!r} is an RL job but tenant {job.tenant_id!r} is "
                "configured with algorithm 'sft'; use ppo, grpo or reinforce",
                job_id=job.job_id,
            )
        fields.append("advantages")
        if algo.name != "reinforce":
            fields.append("actor_log_probs" if "actor_log_probs" in available else "log_probs")
        if algo.name == "ppo" and slot.config.value_head:
            fields.append("returns")
        return fields

    def _check_annotations(self, job: TrainingJob, slot: _Slot, meta: BatchMeta) -> None:
        for index, sm in zip(meta.indexes, meta.sample_meta, strict=True):
            if sm.tenant_id != job.tenant_id:
                raise PermissionDeniedError(
                    f"job {job.job_id!r}: sample {index} belongs to tenant {sm.tenant_id!r}",
                    job_id=job.job_id,
                )
            if sm.schema_signature != slot.signature:
                raise SchemaMismatchError(
                    f"job {job.job_id!r}: sample {index} has schema signature "
                    f"{sm.schema_signature!r}; tenant trains {slot.signature!r}",
                    job_id=job.job_id,
                    field="schema_signature",
                )

    async def _plan(self, job: TrainingJob) -> tuple[_Slot, list[str]]:
        """The job's slot and fields, refused as the real ``plan_job`` refuses it."""
        slot = self._slots.get(job.tenant_id)
        if slot is None:
            raise NotFoundError(
                f"job {job.job_id!r}: tenant {job.tenant_id!r} has no training slot; "
                f"known: {self.tenant_ids()}",
                job_id=job.job_id,
                tenant_id=job.tenant_id,
            )
        if job.schema_signature is not None and job.schema_signature != slot.signature:
            raise SchemaMismatchError(
                f"job {job.job_id!r} declares schema signature {job.schema_signature!r}; "
                f"tenant {job.tenant_id!r} trains {slot.signature!r}",
                job_id=job.job_id,
            )
        if job.sample_count <= 0:
            raise InvalidRequestError(f"job {job.job_id!r}: sample_count must be positive")
        available = set((await asyncio.to_thread(self.queue.info, job.partition_id)).fields)
        return slot, self._fields(job, slot, available)

    async def _microbatch(
        self, job: TrainingJob, slot: _Slot, fields: list[str], task: str, k: int
    ) -> tuple[BatchMeta, dict[str, Any]]:
        """Microbatch ``k`` (annotations checked); every epoch reads from the start."""
        pid, n, mb = job.partition_id, job.sample_count, slot.config.algorithm.microbatch_size
        per_epoch = math.ceil(n / mb)
        if k % per_epoch == 0:
            self.queue.reset_consumption(pid, task)
        size = min(mb, n - (k % per_epoch) * mb)
        meta = await self.queue.async_get_meta(pid, fields, size, task)
        if meta.size != size:
            raise ConflictError(
                f"job {job.job_id!r}: partition {pid!r} has fewer ready samples than its "
                f"sample_count {n} (microbatch {k} expected {size}, got {meta.size} with "
                f"fields {fields})",
                job_id=job.job_id,
                partition_id=pid,
            )
        self._check_annotations(job, slot, meta)
        return meta, await self.queue.async_get_data(meta)

    async def train_job(
        self, job: TrainingJob, *, heartbeat: Callable[[], None] | None = None
    ) -> TrainJobResult:
        slot, fields = await self._plan(job)
        losses: list[float] = []
        samples = 0
        algo = slot.config.algorithm
        for k in range(math.ceil(job.sample_count / algo.microbatch_size) * algo.epochs):
            meta, data = await self._microbatch(job, slot, fields, TRAIN_TASK, k)
            if self.fail_job is not None and (error := self.fail_job(job)) is not None:
                raise error
            # The "optimizer step": a deterministic function of the batch.
            signal = as_numpy(data["advantages"]) if "advantages" in data else np.ones(1)
            loss = float(np.mean(np.abs(signal)))
            slot.weights = (slot.weights + np.float32(0.01 * (1.0 + loss))).astype(np.float32)
            slot.version += 1
            losses.append(loss)
            samples += meta.size
            if self.on_step is not None:
                await self.on_step(job, slot.version)
            await _thread_hop()
            if heartbeat is not None:
                heartbeat()
        slot.applied.append(job.job_id)
        self.trained.append((job.tenant_id, job.job_id, slot.version))
        return TrainJobResult(
            job_id=job.job_id,
            tenant_id=job.tenant_id,
            task_type=str(job.task_type),
            num_microbatches=len(losses),
            num_samples=samples,
            losses=losses,
            metrics={"loss": float(np.mean(losses))} if losses else {},
            policy_version=slot.version,
        )

    async def train_jobs_isolated(
        self,
        jobs: Sequence[TrainingJob],
        *,
        heartbeat: Callable[[], None] | None = None,
    ) -> list[TrainJobResult | Exception]:
        out: list[TrainJobResult | Exception] = []
        for job in jobs:
            try:
                out.append(await self.train_job(job, heartbeat=heartbeat))
            except Exception as error:
                out.append(error)
        return out

    async def train_batch(self, tenant_id: str, batch: TrainBatch) -> StepResult:
        slot = self._slot(tenant_id)
        batch.observations.validate(slot.schema)
        batch.check()  # the real service's own checks, in its order
        slot.weights = (slot.weights + np.float32(0.01)).astype(np.float32)
        slot.version += 1
        slot.applied.append("train_batch")
        await _thread_hop()
        return StepResult(loss=0.0, policy_version=slot.version, grad_norm=0.0)

    async def actor_forward(self, job: TrainingJob) -> None:
        slot, _ = await self._plan(job)
        fields = [*observation_fields(slot.schema), "actions"]
        for k in range(math.ceil(job.sample_count / slot.config.algorithm.microbatch_size)):
            meta, _ = await self._microbatch(job, slot, fields, ACTOR_FORWARD_TASK, k)
            zeros = np.zeros(meta.size, np.float32)
            await self.queue.async_put({"actor_log_probs": zeros, "actor_values": zeros}, meta)

    # --- publication and checkpoints ------------------------------------------------------

    async def export_params(self, tenant_id: str) -> TenantPayload:
        slot = self._slot(tenant_id)
        await _thread_hop()
        slot = self._slot(tenant_id)
        return TenantPayload(
            tenant_id=tenant_id,
            policy_version=slot.version,
            schema_signature=slot.signature,
            named_tensors={WEIGHT: torch.from_numpy(slot.weights.copy())},
            normalization=slot.config.normalization,
        )

    def checkpoint_root(self, tenant_id: str) -> Path:
        out = self.config(tenant_id).output_dir
        return out if out.is_absolute() else self.output_dir / out

    def _write(self, slot: _Slot, step: int, include_optim: bool, ledger: dict[str, Any]) -> Path:
        """Write ``slot`` (a live slot or a staged copy of one) as ``step``."""
        tid = slot.config.tenant_id
        final = checkpoint_dir(self.checkpoint_root(tid), tid, step)
        if final.exists():
            raise ConflictError(f"checkpoint {final} already exists", path=str(final))
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".step_{step}.", suffix=".tmp", dir=final.parent))
        try:
            state = {
                "version": slot.version,
                "weights": slot.weights.tolist(),
                "applied": slot.applied,
            }
            self.write_text(tmp / STATE_FILE, json.dumps(state))
            if include_optim:
                self.write_text(tmp / OPTIMIZER_FILE, json.dumps({"step": slot.version}))
            manifest = CheckpointManifest(
                tenant_id=tid,
                schema_signature=slot.signature,
                base_model_id=self.base.model_id,
                policy_version=slot.version,
                step=step,
                created=float(self.clock.wall()),
                head=slot.config.head.model_dump(mode="json"),
                value_head=None,
                includes_optimizer=include_optim,
                files={p.name: _sha256(p) for p in sorted(tmp.iterdir())},
                ledger=ledger,
            )
            self.write_text(tmp / MANIFEST_FILE, manifest.model_dump_json(indent=2))
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    async def save(
        self,
        step: int,
        tenant_ids: Sequence[str] | None = None,
        include_optim: bool = True,
        ledger: Mapping[str, Any] | None = None,
    ) -> list[Path]:
        ids = list(tenant_ids) if tenant_ids is not None else self.tenant_ids()
        slots = [self._slot(t) for t in ids]
        record = dict(ledger or {})
        # The real service writes in a worker thread: the files are on disk even when
        # the awaiting task is cancelled before it resumes.
        paths = [self._write(s, step, include_optim, record) for s in slots]
        if self.on_saved is not None:
            for s in slots:
                await self.on_saved(s.config.tenant_id, step, record)
        await _thread_hop()
        return paths

    async def stage_save(
        self,
        step: int,
        tenant_ids: Sequence[str] | None = None,
        include_optim: bool = True,
        ledger: Mapping[str, Any] | None = None,
    ) -> str:
        ids = list(tenant_ids) if tenant_ids is not None else self.tenant_ids()
        copies = [
            _Slot(s.config, s.signature, s.version, s.weights.copy(), list(s.applied))
            for s in (self._slot(t) for t in ids)
        ]
        await _thread_hop()
        self._staged_seq += 1
        token = f"save-{self._staged_seq}"
        self._staged[token] = (step, copies, include_optim, dict(ledger or {}))
        return token

    async def write_staged(self, token: str) -> list[Path]:
        try:
            step, copies, include_optim, record = self._staged.pop(token)
        except KeyError:
            raise NotFoundError(f"no staged save {token!r}") from None
        paths = [self._write(s, step, include_optim, record) for s in copies]
        if self.on_saved is not None:
            for s in copies:
                await self.on_saved(s.config.tenant_id, step, record)
        await _thread_hop()
        return paths

    async def discard_staged(self, token: str) -> None:
        self._staged.pop(token, None)

    async def prune_checkpoints(
        self, tenant_id: str, *, keep_last: int = 2, keep_every: int = 0
    ) -> list[Path]:
        root = self.checkpoint_root(tenant_id) / tenant_id
        steps = sorted(
            (int(m.group(1)), child)
            for child in (root.iterdir() if root.is_dir() else [])
            if (m := _STEP_DIR.match(child.name)) and (child / MANIFEST_FILE).is_file()
        )
        doomed = [
            path
            for step, path in steps[: -max(keep_last, 1)]
            if not (keep_every > 0 and step % keep_every == 0)
        ]
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)
        await _thread_hop()
        return doomed

    def latest_checkpoint(self, tenant_id: str) -> Path | None:
        return find_latest_checkpoint(self.checkpoint_root(tenant_id), tenant_id)

    def checkpoint_ledger(self, tenant_id: str) -> dict[str, Any]:
        latest = self.latest_checkpoint(tenant_id)
        return {} if latest is None else dict(read_manifest(latest).ledger)

    async def restore(self, tenant_id: str, checkpoint: Path | None = None) -> int:
        slot = self._slot(tenant_id)
        path = checkpoint if checkpoint is not None else self.latest_checkpoint(tenant_id)
        if path is None:
            raise NotFoundError(
                f"tenant {tenant_id!r} has no checkpoint under "
                f"{self.checkpoint_root(tenant_id) / tenant_id}",
                tenant_id=tenant_id,
            )
        await _thread_hop()
        manifest = read_manifest(path)
        if manifest.tenant_id != tenant_id:
            raise InvalidRequestError(
                f"checkpoint {path} belongs to tenant {manifest.tenant_id!r}, not {tenant_id!r}",
                field="tenant_id",
            )
        if manifest.schema_signature != slot.signature:
            raise SchemaMismatchError(
                f"checkpoint schema signature {manifest.schema_signature!r} does not match "
                f"the slot's {slot.signature!r}",
                field="schema_signature",
            )
        state = json.loads((path / STATE_FILE).read_text())
        slot.weights = np.asarray(state["weights"], np.float32)
        slot.applied = list(state["applied"])
        slot.version = manifest.policy_version
        return slot.version


def checkpointed_state(output_root: Path, tenant_id: str) -> dict[str, Any] | None:
    """The tenant's latest checkpoint as the fake wrote it: ``version``, ``weights``,
    ``applied`` (the job ids of its updates) and ``ledger``; None without one."""
    latest = find_latest_checkpoint(output_root, tenant_id)
    if latest is None:
        return None
    state: dict[str, Any] = json.loads((latest / STATE_FILE).read_text())
    state["ledger"] = read_manifest(latest).ledger
    state["step"] = read_manifest(latest).step
    return state
