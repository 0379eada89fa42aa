"""A fake execution plane: the Master Service's services without a model or a simulator.

What is faked is only what is heavy; the rest is the real thing:

* real: the Training Scheduler (SQLite in the run directory), the Training Queue (in
  memory), the workload store, the checkpoint layout and manifest
  (:class:`~joynexus.models.payload.CheckpointManifest`, so the Master's own ledger
  reads work), the rollout / evaluation loops of :mod:`joynexus.services.rollout`
  (composed over the fake ``predict`` and the fake environment, exactly as the real
  Inference Model Service composes them), every workflow loop and the Master itself;
* fake: the resident base model (:class:`FakeBase`: an id, camera slots and schema
  signatures), the Training Model Service (a per-tenant version counter and a few numpy
  "weights" that each microbatch updates, checkpointed to disk with the ledger), the
  Inference Model Service (versioned weights, deterministic zero actions) and the
  Environment Service (numpy sub-envs with fixed-length episodes).

The fakes keep the real services' contracts: the same errors for the same misuse
(unknown tenant → ``NotFoundError``, an older published version → ``ConflictError``,
a short partition → ``ConflictError``, ...) and the same suspension points — every call
the real service runs in a worker thread yields to the event loop here too, *after* its
effect (a version step, a checkpoint written), so a cancellation or a "kill" can land
exactly where it could land on the real plane. Hooks (``on_step``, ``on_saved``,
``fail_job``, ``rollout_delay_s``) let a test stop the plane at such a point.

Every training update records the job it came from in the weights (``applied``), and
checkpoints persist it: a test can check that the completed jobs are exactly the
updates in the weights.

:class:`FakeProcess` is one "process": its own event loop. ``kill()`` abandons it the
way ``kill -9`` would (no ``finally`` block, no ``aclose``; only what was committed to
SQLite and the checkpoints survives); :func:`open_fake_plane` on the same run directory
is the process that comes up next.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import numpy as np
import torch

from joynexus.control.job import TaskType, TrainingJob
from joynexus.control.scheduler import TrainingScheduler
from joynexus.envs.base import EnvObservation, EnvSpec, EnvStep
from joynexus.envs.registry import env_schema
from joynexus.errors import (
    CapacityError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    SchemaMismatchError,
    ServiceUnavailableError,
    SimulatorCrashedError,
)
from joynexus.master.limits import MasterLimits
from joynexus.master.service import MasterService
from joynexus.master.store import InMemoryWorkloadStore, SQLiteWorkloadStore, WorkloadStore
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.payload import (
    MANIFEST_FILE,
    CheckpointManifest,
    TenantPayload,
    checkpoint_dir,
    find_latest_checkpoint,
    read_manifest,
)
from joynexus.models.schema import DataSchema, prefix_key, schema_signature
from joynexus.models.slots import StepResult
from joynexus.queues.inference_metrics import InferenceQueueMetrics, QueueWaitStats
from joynexus.queues.meta import BatchMeta
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import SessionInfo
from joynexus.services.rollout import (
    EvalResult,
    PredictResult,
    RolloutConfig,
    RolloutStats,
    collect_rollout,
    run_evaluation,
)
from joynexus.services.samples import as_numpy, observation_fields
from joynexus.services.tenancy import TenantConfig, TenantInfo
from joynexus.services.training import TrainBatch, TrainJobResult
from joynexus.spec.workload import WorkloadSpec, parse_spec
from joynexus.utils.clock import Clock, SystemClock

if TYPE_CHECKING:
    from joynexus.services.protocols import (
        EnvironmentServiceAPI,
        InferenceModelServiceAPI,
        TrainingModelServiceAPI,
        TrainingQueueAPI,
    )

__all__ = [
    "FAKE_BASE_ID",
    "FakeBase",
    "FakeEnvironmentService",
    "FakeInferenceService",
    "FakePlane",
    "FakeProcess",
    "FakeServer",
    "FakeTrainingService",
    "ProcessKilled",
    "checkpointed_state",
    "custom_spec",
    "eval_spec",
    "fakes_of",
    "make_fake_master",
    "master_on",
    "open_fake_plane",
    "rl_spec",
    "start_master",
]

T = TypeVar("T")

FAKE_BASE_ID = "fake-base"
#: The one tensor of a fake action module (what payloads and checkpoints carry).
WEIGHT = "action_module.weight"
WEIGHT_SIZE = 4
STATE_FILE = "fake_slot.json"
OPTIMIZER_FILE = "fake_optimizer.json"
TRAIN_TASK = "train"
ACTOR_FORWARD_TASK = "actor_forward"
_STEP_DIR = re.compile(r"^step_(\d+)$")


async def _thread_hop() -> None:
    """Where the real service returns from its worker thread: the loop runs others."""
    await asyncio.sleep(0)


# ----------------------------------------------------------------------------- base


class FakeBase:
    """What the Master and ``start_tenant`` read of the resident base model.

    ``MasterService.compile`` reads ``num_camera_slots``; manifests and evaluation
    tenants use ``signature_for``; the fake services also use ``model_id`` and
    ``prefix_key``. Nothing else of :class:`ResidentBaseModel` is touched.
    """

    def __init__(
        self,
        model_id: str = FAKE_BASE_ID,
        *,
        num_camera_slots: int = 2,
        canonical_image_size: int = 16,
    ) -> None:
        self.model_id = model_id
        self.arch = "fake"
        self.num_camera_slots = num_camera_slots
        self.canonical_image_size = canonical_image_size
        self.device = torch.device("cpu")

    def signature_for(self, schema: DataSchema) -> str:
        return schema_signature(
            schema, base_model_id=self.model_id, canonical_image_size=self.canonical_image_size
        )

    def prefix_key(self) -> str:
        return prefix_key(
            base_model_id=self.model_id,
            num_camera_slots=self.num_camera_slots,
            canonical_image_size=self.canonical_image_size,
        )


# ------------------------------------------------------------------------- training


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
        step_s: Seconds each microbatch "takes" (awaited on the real event loop).
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
        self.step_s = 0.0
        #: (tenant, job id, version after) of every job trained to its end.
        self.trained: list[tuple[str, str, int]] = []
        #: (tenant, step, ledger) of every checkpoint written.
        self.saves: list[tuple[str, int, dict[str, Any]]] = []

    # --- tenants -------------------------------------------------------------------

    def _slot(self, tenant_id: str) -> _Slot:
        slot = self._slots.get(tenant_id)
        if slot is None:
            raise NotFoundError(
                f"tenant {tenant_id!r} has no training slot; known: {self.tenant_ids()}",
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

    def applied(self, tenant_id: str) -> list[str]:
        """The jobs whose updates the tenant's current weights contain (tests)."""
        return list(self._slot(tenant_id).applied)

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

    async def train_job(
        self, job: TrainingJob, *, heartbeat: Callable[[], None] | None = None
    ) -> TrainJobResult:
        slot = self._slot(job.tenant_id)
        if job.schema_signature is not None and job.schema_signature != slot.signature:
            raise SchemaMismatchError(
                f"job {job.job_id!r} declares schema signature {job.schema_signature!r}; "
                f"tenant {job.tenant_id!r} trains {slot.signature!r}",
                job_id=job.job_id,
            )
        if job.sample_count <= 0:
            raise InvalidRequestError(f"job {job.job_id!r}: sample_count must be positive")
        pid = job.partition_id
        available = set((await asyncio.to_thread(self.queue.info, pid)).fields)
        fields = self._fields(job, slot, available)
        algo = slot.config.algorithm
        per_epoch = math.ceil(job.sample_count / algo.microbatch_size)
        losses: list[float] = []
        samples = 0
        self.queue.reset_consumption(pid, TRAIN_TASK)
        for k in range(per_epoch * algo.epochs):
            if k > 0 and k % per_epoch == 0:
                self.queue.reset_consumption(pid, TRAIN_TASK)
            i = k % per_epoch
            size = min(algo.microbatch_size, job.sample_count - i * algo.microbatch_size)
            meta = await self.queue.async_get_meta(pid, fields, size, TRAIN_TASK)
            if meta.size != size:
                raise ConflictError(
                    f"job {job.job_id!r}: partition {pid!r} has fewer ready samples than its "
                    f"sample_count {job.sample_count} (microbatch {k} expected {size}, got "
                    f"{meta.size} with fields {fields})",
                    job_id=job.job_id,
                    partition_id=pid,
                )
            self._check_annotations(job, slot, meta)
            data = await self.queue.async_get_data(meta)
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
            if self.step_s > 0:
                await asyncio.sleep(self.step_s)
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
        if batch.observations.actions is None:
            raise InvalidRequestError("train_batch needs observations.actions", field="actions")
        if batch.loss != "sft" and batch.advantages is None:
            raise InvalidRequestError(
                f"loss {batch.loss!r} needs advantages float32 [B]", field="advantages"
            )
        slot.weights = (slot.weights + np.float32(0.01)).astype(np.float32)
        slot.version += 1
        slot.applied.append("train_batch")
        await _thread_hop()
        return StepResult(loss=0.0, policy_version=slot.version, grad_norm=0.0)

    async def actor_forward(self, job: TrainingJob) -> None:
        slot = self._slot(job.tenant_id)
        pid = job.partition_id
        fields = [*observation_fields(slot.schema), "actions"]
        self.queue.reset_consumption(pid, ACTOR_FORWARD_TASK)
        done = 0
        while done < job.sample_count:
            size = min(slot.config.algorithm.microbatch_size, job.sample_count - done)
            meta = await self.queue.async_get_meta(pid, fields, size, ACTOR_FORWARD_TASK)
            if meta.size != size:
                raise ConflictError(
                    f"job {job.job_id!r}: partition {pid!r} has {done + meta.size} samples, "
                    f"fewer than its sample_count {job.sample_count}",
                    job_id=job.job_id,
                )
            self._check_annotations(job, slot, meta)
            zeros = np.zeros(meta.size, np.float32)
            await self.queue.async_put({"actor_log_probs": zeros, "actor_values": zeros}, meta)
            done += size

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
            (tmp / STATE_FILE).write_text(json.dumps(state))
            if include_optim:
                (tmp / OPTIMIZER_FILE).write_text(json.dumps({"step": slot.version}))
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
            (tmp / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=2))
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
        for s in slots:
            self.saves.append((s.config.tenant_id, step, record))
        if self.on_saved is not None:
            for s in slots:
                await self.on_saved(s.config.tenant_id, step, record)
        await _thread_hop()
        return paths

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
        if manifest.base_model_id != self.base.model_id:
            raise SchemaMismatchError(
                f"checkpoint was trained on base model {manifest.base_model_id!r}",
                field="base_model",
            )
        for name, digest in manifest.files.items():
            if not (path / name).is_file() or _sha256(path / name) != digest:
                raise InvalidRequestError(f"checkpoint file {path / name} does not match")
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


# ------------------------------------------------------------------------ inference


@dataclass
class _Served:
    config: TenantConfig
    signature: str
    latest: int
    versions: dict[int, np.ndarray]
    pins: dict[int, int] = field(default_factory=dict)


class FakeInferenceService:
    """The Inference Model Service's contract without a model.

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
        self.rollouts = 0
        self.predicts = 0

    async def start(self) -> None:
        self.running = True

    async def stop(self) -> None:
        self.running = False

    @property
    def metrics(self) -> InferenceQueueMetrics:
        return InferenceQueueMetrics(
            max_batch_size=128,
            max_wait_s=0.0,
            queue_depth=0,
            requests=self.predicts,
            completed=self.predicts,
            errors=0,
            validation_failures=0,
            rejections=0,
            timeouts=0,
            cancellations=0,
            batches=self.predicts,
            retried_batches=0,
            samples=0,
            batch_size_histogram={},
            mean_batch_size=0.0,
            fill_ratio=0.0,
            queue_wait=QueueWaitStats(
                count=0, mean_s=0.0, max_s=0.0, p50_s=0.0, p95_s=0.0, p99_s=0.0
            ),
        )

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
        if set(named) != {WEIGHT}:
            raise InvalidRequestError(
                f"tenant {tenant_id!r}: tensors {sorted(named)} do not fit its action module "
                f"(expected {[WEIGHT]})"
            )
        value = named[WEIGHT]
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
        served = self._tenant(tenant_id)
        if version < served.latest:
            raise ConflictError(
                f"tenant {tenant_id!r}: cannot publish version {version}, version "
                f"{served.latest} is already served",
                tenant_id=tenant_id,
            )
        weights = self._weights(tenant_id, named_tensors)
        await _thread_hop()
        served = self._tenant(tenant_id)
        if version < served.latest:
            raise ConflictError(f"tenant {tenant_id!r}: version {served.latest} was published")
        served.versions[version] = weights
        served.latest = version
        for v in list(served.versions):
            if v != version and served.pins.get(v, 0) == 0:
                del served.versions[v]
        self.published.setdefault(tenant_id, []).append(version)

    def current_policy_version(self, tenant_id: str) -> int:
        return self._tenant(tenant_id).latest

    def served_weights(self, tenant_id: str) -> np.ndarray:
        """The weights of the latest served version (tests)."""
        served = self._tenant(tenant_id)
        return served.versions[served.latest].copy()

    @contextlib.contextmanager
    def _pinned(self, tenant_id: str, version: int | None) -> Any:
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
            if served.pins[v] == 0:
                del served.pins[v]
            if v != served.latest and not served.pins.get(v):
                served.versions.pop(v, None)

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
        self.predicts += 1
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
            self.rollouts += 1
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


# ---------------------------------------------------------------------- environment


@dataclass
class _Session:
    info: SessionInfo
    spec: EnvSpec
    episode_steps: int
    steps: np.ndarray
    crashed: bool = False


class FakeEnvironmentService:
    """The Environment Service's contract with numpy sub-envs.

    Episodes last ``spec.max_episode_steps`` (default 4) steps; every step rewards 0.1;
    an episode of an even sub-env succeeds. Finished sub-envs auto-reset, like the real
    adapters. :meth:`crash` makes a session's calls raise ``SimulatorCrashedError``.

    Attributes:
        created / closed: Session ids, in order.
    """

    def __init__(self, *, max_sessions_per_tenant: int = 4) -> None:
        self.max_sessions_per_tenant = max_sessions_per_tenant
        self._sessions: dict[str, _Session] = {}
        self._ids = itertools.count(1)
        self.created: list[str] = []
        self.closed: list[str] = []

    def _owned(self, session_id: str, tenant_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise NotFoundError(f"no environment session {session_id!r}", session_id=session_id)
        if session.info.tenant_id != tenant_id:
            raise PermissionDeniedError(
                f"session {session_id!r} belongs to another tenant", session_id=session_id
            )
        if session.crashed:
            raise SimulatorCrashedError(f"session {session_id!r}: the simulator died")
        return session

    def open_sessions(self, tenant_id: str | None = None) -> list[str]:
        return [sid for sid, s in self._sessions.items() if tenant_id in (None, s.info.tenant_id)]

    async def create_session(self, tenant_id: str, spec: EnvSpec) -> SessionInfo:
        schema = env_schema(spec)  # SpecError for an unknown kind, like the real one
        held = sum(1 for s in self._sessions.values() if s.info.tenant_id == tenant_id)
        if held >= self.max_sessions_per_tenant:
            raise CapacityError(
                f"tenant {tenant_id!r} already holds {held} environment sessions",
                tenant_id=tenant_id,
            )
        await _thread_hop()
        sid = f"sess-{next(self._ids)}"
        info = SessionInfo(sid, tenant_id, schema, spec.num_envs, spec.kind, spec.task)
        self._sessions[sid] = _Session(
            info, spec, spec.max_episode_steps or 4, np.zeros(spec.num_envs, np.int64)
        )
        self.created.append(sid)
        return info

    async def list_sessions(self, tenant_id: str) -> list[SessionInfo]:
        return [s.info for s in self._sessions.values() if s.info.tenant_id == tenant_id]

    def _observation(self, session: _Session) -> EnvObservation:
        schema, n = session.info.schema, session.info.num_envs
        return EnvObservation(
            cameras={c: np.zeros((n, *cam.shape), np.uint8) for c, cam in schema.cameras.items()},
            state=np.zeros((n, schema.state_dim), np.float32),
            instruction=schema.instruction,
        )

    async def reset(
        self,
        session_id: str,
        rollout_id: str,
        seed: int | None = None,
        *,
        tenant_id: str,
        group_size: int = 1,
    ) -> EnvObservation:
        session = self._owned(session_id, tenant_id)
        session.steps[:] = 0
        return self._observation(session)

    async def step(self, session_id: str, actions: Any, *, tenant_id: str) -> EnvStep:
        session = self._owned(session_id, tenant_id)
        acts = np.asarray(actions, np.float32)
        n, dim = session.info.num_envs, session.info.schema.action_dim
        if acts.shape != (n, dim):
            raise InvalidRequestError(
                f"actions must be float32 [{n}, {dim}], got {list(acts.shape)}", field="actions"
            )
        session.steps += 1
        ended = session.steps >= session.episode_steps
        session.steps[ended] = 0  # auto-reset
        return EnvStep(
            observation=self._observation(session),
            reward=np.full(n, 0.1, np.float32),
            terminated=ended.copy(),
            truncated=np.zeros(n, bool),
            success=ended & (np.arange(n) % 2 == 0),
        )

    async def close(self, session_id: str, *, tenant_id: str) -> None:
        session = self._sessions.get(session_id)
        if session is None:
            raise NotFoundError(f"no environment session {session_id!r}", session_id=session_id)
        if session.info.tenant_id != tenant_id:
            raise PermissionDeniedError(f"session {session_id!r} belongs to another tenant")
        del self._sessions[session_id]
        self.closed.append(session_id)

    async def aclose(self) -> None:
        self.closed.extend(self._sessions)
        self._sessions.clear()

    def is_crashed(self, session_id: str) -> bool:
        session = self._sessions.get(session_id)
        return session is not None and session.crashed

    def crash(self, session_id: str) -> None:
        """Kill the session's simulator (tests)."""
        self._sessions[session_id].crashed = True


# ---------------------------------------------------------------------------- plane


@dataclass
class FakePlane:
    """One process's execution plane on a run directory (what ``build_plane`` gives).

    ``scheduler.sqlite`` (jobs and workload records) and ``outputs/`` (checkpoints)
    are what outlive the process; everything else is in memory.
    """

    run_dir: Path
    base: FakeBase
    scheduler: TrainingScheduler
    store: WorkloadStore
    queue: TrainingQueue
    env: FakeEnvironmentService
    training: FakeTrainingService
    inference: FakeInferenceService
    clock: Clock

    @property
    def output_root(self) -> Path:
        return self.run_dir / "outputs"

    def close(self) -> None:
        """Release the SQLite connections (committed state stays)."""
        self.store.close()
        self.scheduler.close()


def open_fake_plane(
    run_dir: Path,
    *,
    clock: Clock | None = None,
    store: WorkloadStore | None = None,
    durable: bool = True,
    lease_ttl_s: float = 30.0,
    base: FakeBase | None = None,
) -> FakePlane:
    """The fake plane of one process on ``run_dir``.

    Args:
        durable: Scheduler and (default) workload store in ``run_dir/scheduler.sqlite``,
            so a later call on the same directory recovers them; False: in memory.
        store: The workload store (default: SQLite when durable, else in memory).
    """
    clk: Clock = clock or SystemClock()
    run_dir.mkdir(parents=True, exist_ok=True)
    db = run_dir / "scheduler.sqlite"
    scheduler = (
        TrainingScheduler.open(db, clock=clk, lease_ttl_s=lease_ttl_s)
        if durable
        else TrainingScheduler.in_memory(clock=clk, lease_ttl_s=lease_ttl_s)
    )
    if store is None:
        store = SQLiteWorkloadStore(db) if durable else InMemoryWorkloadStore()
    fake_base = base or FakeBase()
    queue = TrainingQueue()
    env = FakeEnvironmentService()
    training = FakeTrainingService(fake_base, queue, output_dir=run_dir / "outputs", clock=clk)
    inference = FakeInferenceService(fake_base, env, queue)
    return FakePlane(run_dir, fake_base, scheduler, store, queue, env, training, inference, clk)


def master_on(
    plane: FakePlane,
    *,
    limits: MasterLimits | None = None,
    poll_s: float = 0.002,
    max_failures: int = 5,
    heldout_samples: int | None = None,
    watchdog_factor: float = 20.0,
    watchdog_min_s: float = 120.0,
    restart_grace_s: float = 60.0,
) -> MasterService:
    """A Master Service on ``plane`` (constructed like ``LocalRun.open`` builds it)."""
    return MasterService(
        base=cast(ResidentBaseModel, plane.base),
        base_model_id=plane.base.model_id,
        scheduler=plane.scheduler,
        queue=plane.queue,
        env=plane.env,
        training=plane.training,
        inference=plane.inference,
        output_root=plane.output_root,
        limits=limits,
        clock=plane.clock,
        poll_s=poll_s,
        max_failures=max_failures,
        store=plane.store,
        heldout_samples=heldout_samples,
        watchdog_factor=watchdog_factor,
        watchdog_min_s=watchdog_min_s,
        restart_grace_s=restart_grace_s,
    )


def make_fake_master(
    tmp_path: Path,
    store: WorkloadStore | None = None,
    clock: Clock | None = None,
    **kwargs: Any,
) -> MasterService:
    """A Master Service on a fresh fake plane in ``tmp_path`` (not started).

    ``kwargs`` go to :func:`master_on` (limits, poll_s, max_failures, ...); reach the
    fakes with :func:`fakes_of`.
    """
    return master_on(open_fake_plane(tmp_path, clock=clock, store=store), **kwargs)


async def start_master(master: MasterService) -> MasterService:
    """Start the plane's serving and then the Master (the order ``LocalRun.open`` uses:
    the Inference Model Service first, then :meth:`MasterService.start`, which recovers
    what the run directory holds)."""
    await master.inference.start()
    await master.start()
    return master


def fakes_of(master: MasterService) -> FakePlane:
    """The fake plane under ``master`` (typed, so tests reach the fakes' hooks)."""
    assert isinstance(master.training, FakeTrainingService)
    assert isinstance(master.inference, FakeInferenceService)
    assert isinstance(master.env, FakeEnvironmentService)
    assert isinstance(master.queue, TrainingQueue)
    assert isinstance(master.base, FakeBase)
    return FakePlane(
        run_dir=master.output_root.parent,
        base=master.base,
        scheduler=master.scheduler,
        store=master.store,
        queue=master.queue,
        env=master.env,
        training=master.training,
        inference=master.inference,
        clock=master.clock,
    )


# -------------------------------------------------------------------------- process


class ProcessKilled(BaseException):
    """Raised by every method of an object whose process was killed.

    A ``BaseException`` (like ``CancelledError``), so the loops' ``except Exception``
    retry handlers never catch it and a dead coroutine unwinds instead of spinning.
    """


def _bury(obj: Any) -> None:
    """Make every public or private method of ``obj`` raise :class:`ProcessKilled`."""

    def dead(*_args: Any, **_kwargs: Any) -> Any:
        raise ProcessKilled(f"{type(obj).__name__} died with its process")

    for name in dir(type(obj)):
        if name.startswith("__"):
            continue
        attr = getattr(type(obj), name, None)
        if callable(attr) and not isinstance(attr, (type, property)):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(obj, name, dead)


class FakeProcess:
    """One "process" of the service: its own event loop.

    :meth:`run` drives a coroutine on it; :meth:`kill` abandons it like ``kill -9``
    (pending tasks never run again: no ``finally``, no ``aclose``; what they committed
    stays); :meth:`shutdown` is the orderly end (cancel what is left, close the loop).
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.dead = False

    def run(self, coro: Coroutine[Any, Any, T], *, timeout_s: float | None = 30.0) -> T:
        assert not self.dead, "this process was killed"

        async def bounded() -> T:
            return await asyncio.wait_for(coro, timeout_s)

        return self.loop.run_until_complete(bounded())

    def sleep(self, seconds: float) -> None:
        """Let the process run for ``seconds`` of wall time."""
        self.run(asyncio.sleep(seconds))

    def run_or_report(self, coro: Coroutine[Any, Any, T], *, timeout_s: float = 10.0) -> T:
        """:meth:`run`, but a timeout raises an AssertionError naming every task still
        pending, with its stack (a shutdown that hangs says what hangs it)."""
        assert not self.dead, "this process was killed"

        async def watched() -> T:
            task = asyncio.ensure_future(coro)
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
            if task in done:
                return task.result()
            me = asyncio.current_task()
            lines = []
            for other in asyncio.all_tasks():
                if other is me or other is task:
                    continue
                frames = [
                    f"{f.f_code.co_filename.rsplit('/', 3)[-1]}:{f.f_lineno} {f.f_code.co_name}"
                    for f in other.get_stack(limit=12)
                ]
                lines.append(f"  {other.get_name()}: " + " <- ".join(reversed(frames)))
            task.cancel()
            raise AssertionError(
                f"{getattr(coro, '__qualname__', coro)} not done within {timeout_s} s; "
                "other pending tasks:\n" + "\n".join(lines)
            )

        return self.loop.run_until_complete(watched())

    def run_until(
        self, predicate: Callable[[], bool], *, timeout_s: float = 10.0, what: str = ""
    ) -> None:
        """Run the process until ``predicate()`` holds (checked every 2 ms).

        Raises:
            AssertionError: it did not within ``timeout_s``.
        """

        async def wait() -> None:
            while not predicate():
                await asyncio.sleep(0.002)

        try:
            self.run(wait(), timeout_s=timeout_s)
        except TimeoutError:
            raise AssertionError(f"not reached within {timeout_s} s: {what}") from None

    def kill(self, *things: Any) -> None:
        """``kill -9``: drop the loop with its tasks where they are.

        ``things`` are what died with the process: the :class:`FakePlane` (its SQLite
        connections are closed; what was committed stays) and the Master. Their methods
        raise :class:`ProcessKilled` from now on, so nothing of the process can act on
        the world again; its coroutines are then finalized right here (their ``except``
        / ``finally`` blocks meet only dead objects and unwind).
        """
        if self.dead:
            return
        self.dead = True
        for thing in things:
            if isinstance(thing, FakePlane):
                thing.close()
                for part in (
                    thing.scheduler,
                    thing.store,
                    thing.queue,
                    thing.env,
                    thing.training,
                    thing.inference,
                ):
                    _bury(part)
            else:
                _bury(thing)
        tasks = asyncio.all_tasks(self.loop)
        self.loop.set_exception_handler(lambda _loop, _ctx: None)
        self.loop.close()
        for task in tasks:
            task._log_destroy_pending = False  # type: ignore[attr-defined]
            with contextlib.suppress(BaseException):
                task.get_coro().close()

    def shutdown(self) -> None:
        """Cancel every task left, let them finish, close the loop (idempotent)."""
        if self.dead:
            return
        self.dead = True
        loop = self.loop
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


class FakeServer:
    """A Master Service on the fake plane, in a :class:`FakeProcess` of its own.

    :meth:`restart` ends the process — ``kill=True``: ``kill -9``; else a clean
    ``aclose`` — and brings up a new one on the same run directory (a new Training
    Scheduler and workload store on the same ``scheduler.sqlite``, the same
    checkpoints, everything else fresh), whose Master recovers by itself.

    Args:
        run_dir: The run directory.
        clock: The clock of every process (default: the system clock).
        master_kwargs: For :func:`master_on` (poll_s, max_failures, limits, ...).
    """

    def __init__(self, run_dir: Path, *, clock: Clock | None = None, **master_kwargs: Any):
        self.run_dir = run_dir
        self.clock = clock
        self.master_kwargs = master_kwargs
        self.generation = 0
        #: A clean restart whose ``aclose`` hangs fails the test (the Python 3.11
        #: ``wait_for`` race of test_aclose_stops_the_actor_even_when_a_job_turns_ready
        #: is fixed); set True to go on after ``aclose_timeout_s`` and count it in
        #: ``hung_acloses`` instead.
        self.tolerate_actor_surviving_aclose = False
        self.aclose_timeout_s = 2.0
        self.hung_acloses = 0
        self._open()

    def _open(self) -> None:
        self.generation += 1
        self.process = FakeProcess()
        self.plane = open_fake_plane(self.run_dir, clock=self.clock)
        self.master = master_on(self.plane, **self.master_kwargs)
        self.process.run(start_master(self.master))

    def run(self, coro: Coroutine[Any, Any, T], *, timeout_s: float | None = 30.0) -> T:
        return self.process.run(coro, timeout_s=timeout_s)

    def run_until(
        self, predicate: Callable[[], bool], *, timeout_s: float = 10.0, what: str = ""
    ) -> None:
        self.process.run_until(predicate, timeout_s=timeout_s, what=what)

    def sleep(self, seconds: float) -> None:
        self.process.sleep(seconds)

    def restart(
        self,
        *,
        kill: bool,
        shutdown: Callable[[MasterService], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        """End this process and open the next one on the run directory.

        Args:
            kill: ``kill -9`` (else a clean close).
            shutdown: The clean close to run instead of ``master.aclose()`` (a test that
                interleaves it with other work); it must close the Master.
        """
        if kill:
            self.process.kill(self.plane, self.master)
        else:
            if shutdown is None:
                self._aclose()
            else:
                self.process.run_or_report(shutdown(self.master), timeout_s=self.aclose_timeout_s)
            self.process.shutdown()
            self.plane.close()
        self._open()

    def _aclose(self) -> None:
        try:
            self.process.run_or_report(self.master.aclose(), timeout_s=self.aclose_timeout_s)
        except AssertionError as hang:
            survivors = [line.split(": ")[0].strip() for line in str(hang).splitlines()[1:] if line]
            if not (self.tolerate_actor_surviving_aclose and survivors == ["master:actor"]):
                raise
            # The known Python 3.11 wait_for race (test_fake_plane.py::
            # test_aclose_stops_the_actor_even_when_a_job_turns_ready_at_that_moment):
            # shutdown() cancels the actor again.
            self.hung_acloses += 1

    def close(self) -> None:
        """Shut the current process down cleanly (idempotent)."""
        if self.process.dead:
            return
        with contextlib.suppress(AssertionError):
            self.process.run_or_report(self.master.aclose(), timeout_s=self.aclose_timeout_s)
        self.process.shutdown()
        self.plane.close()


if TYPE_CHECKING:  # the fakes satisfy the protocols (mypy checks these assignments)

    def _conforms(p: FakePlane) -> None:
        _t: TrainingModelServiceAPI = p.training
        _i: InferenceModelServiceAPI = p.inference
        _e: EnvironmentServiceAPI = p.env
        _q: TrainingQueueAPI = p.queue


# ---------------------------------------------------------------------------- specs


def rl_spec(
    tenant: str,
    *,
    target: int | None = 3,
    num_envs: int = 2,
    horizon: int = 2,
    microbatch_size: int | None = None,
    max_in_flight: int = 2,
    **algorithm: Any,
) -> WorkloadSpec:
    """A small RL workload on reach2d (8 px images; one optimizer step per job unless
    ``microbatch_size`` is smaller than ``num_envs * horizon``)."""
    return parse_spec(
        {
            "tenant": tenant,
            "task": "rl",
            "base_model": {"id": FAKE_BASE_ID},
            "env": {
                "kind": "reach2d",
                "num_envs": num_envs,
                "image_size": 8,
                "max_episode_steps": 3,
            },
            "algorithm": {
                "name": "ppo",
                "horizon": horizon,
                "microbatch_size": microbatch_size or num_envs * horizon,
                **algorithm,
            },
            "action_module": {"type": "oft", "hidden_dim": 8, "num_blocks": 1},
            "scheduling": {"completion_target": target, "max_in_flight": max_in_flight},
        }
    )


def eval_spec(
    tenant: str, targets: Sequence[str], *, runs: int = 1, interval_s: float = 0.01
) -> WorkloadSpec:
    """A read-only evaluation of ``targets`` (one episode per run)."""
    return parse_spec(
        {
            "tenant": tenant,
            "task": "eval",
            "base_model": {"id": FAKE_BASE_ID},
            "env": {"kind": "reach2d", "num_envs": 1, "image_size": 8, "max_episode_steps": 3},
            "evaluation": {
                "targets": list(targets),
                "runs": runs,
                "episodes": 1,
                "interval_s": interval_s,
            },
        }
    )


def custom_spec(tenant: str) -> WorkloadSpec:
    """A custom workload: the tenant's slot only, driven through the primitives."""
    return parse_spec(
        {
            "tenant": tenant,
            "task": "custom",
            "base_model": {"id": FAKE_BASE_ID},
            "env": {"kind": "reach2d", "num_envs": 2, "image_size": 8},
            "algorithm": {"name": "reinforce"},
            "action_module": {"type": "oft", "hidden_dim": 8, "num_blocks": 1},
        }
    )
