"""The Master Service (paper §4.1.1): tenant creator and the one workload orchestrator.

One Master hosts workloads on ONE long-lived execution plane (resident base model,
Training Scheduler, Training Queue, Environment / Training / Inference Model Services).
Every entry point runs workloads through it: ``joynexus run`` (an in-process Master,
to completion: :mod:`joynexus.master.run`), ``joynexus serve`` (the same Master behind
HTTP, where tenants submit, pause, resume and cancel at any time) and ``joynexus demo``.

* **Tenant creator** (:meth:`~joynexus.master.compiler.SpecCompiler.compile`):
  strict validation of a :class:`WorkloadSpec` against what this backend can do — the
  resident base model, the registered environment kinds, the dataset roots, the server's
  limits, the backbone's camera slots — through
  :func:`joynexus.workflows.compile.compile_workloads`.
* **Workload orchestrator**: RL connects rollout + inference + environment + training
  (:func:`~joynexus.workflows.rl.rl_producer`); SFT connects a data producer to training
  (:func:`~joynexus.workflows.sft.sft_producer`); evaluation reuses inference +
  environment with no optimization path (:func:`~joynexus.workflows.evaluation.evaluator`);
  custom creates only the tenant's slot, which the tenant drives through the low-level
  primitives. One actor consumer, one advantage stage and (on demand) one actor-forward
  stage serve every tenant (:mod:`joynexus.workflows.launch`).

**Composition.** The Master is composed of parts that share one
:class:`~joynexus.master.records.WorkloadBook` (workloads, tenant slots, their records
and files), and it keeps no delegate methods: every caller (the server's routes, the
Health Manager's hooks, ``joynexus run``, the demo, the tests) calls the part that
answers, and each signature is written once, on that part:

* ``master.compiler`` — :class:`~joynexus.master.compiler.SpecCompiler`, the tenant
  creator (``compile``);
* ``master.lifecycle`` — :class:`~joynexus.master.lifecycle.Lifecycle` (``submit``,
  ``pause``, ``resume``, ``cancel``, ``wait``);
* ``master.supervisor`` — :class:`~joynexus.master.supervision.Supervisor` (one
  supervisor task per workload, the watchdog, visible failure: ``fail_live``,
  ``fail_holder``);
* ``master.recovery`` — :class:`~joynexus.master.recovery.Recovery` (restart: the one
  reader of the checkpoint ledger; ``restart_training``);
* ``master.reporter`` — :class:`~joynexus.master.reporting.Reporter` (``status``,
  ``list_workloads``, ``spec_of``, ``metrics``, ``artifact_root``, ``workload_ids``,
  ``tenant_owner``, ``tenant_of`` and the health views ``degraded``,
  ``session_holders``);
* ``master.book`` — the :class:`~joynexus.master.records.WorkloadBook` itself
  (``tenant_dir``, ``live``);
* ``master.primitives`` — :class:`~joynexus.master.primitives.ModelPrimitives` (the
  low-level model calls: ``predict``, ``train_batch``, ``rollout``, ...).

The Master's own methods are its lifetime only (:meth:`MasterService.start`,
:meth:`MasterService.aclose`). Another tenant's id answers everywhere as an unknown one
(:func:`joynexus.errors.unknown_id`).

**Durability.** Workload records (:mod:`joynexus.master.store`) live in the run
directory's ``scheduler.sqlite`` next to the scheduler's jobs; every update is
checkpointed before it is published or its job completes, so :meth:`MasterService.start`
on the same run directory brings everything back by itself (:mod:`joynexus.master.recovery`).
A clean shutdown (:meth:`aclose`) stops the loops without touching the records, so a
SIGTERM restart resumes exactly like a crash does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from joynexus.control.scheduler import TrainingScheduler
from joynexus.master.compiler import SpecCompiler, global_limits
from joynexus.master.disk import TenantDisk
from joynexus.master.lifecycle import Lifecycle
from joynexus.master.limits import MasterLimits
from joynexus.master.primitives import ModelPrimitives
from joynexus.master.records import CANCELLED_REASON, RESTARTED_REASON, WorkloadBook
from joynexus.master.recovery import Recovery
from joynexus.master.reporting import Reporter
from joynexus.master.store import InMemoryWorkloadStore, WorkloadStore
from joynexus.master.supervision import SupervisionSettings, Supervisor
from joynexus.models.backbone import ResidentBaseModel
from joynexus.services.protocols import (
    EnvironmentServiceAPI,
    InferenceModelServiceAPI,
    TrainingModelServiceAPI,
    TrainingQueueAPI,
)
from joynexus.utils.clock import Clock, SystemClock
from joynexus.workflows import launch
from joynexus.workflows.compile import DOMAIN
from joynexus.workflows.context import ROLE_RESTARTED_REASON, WorkflowContext

__all__ = [
    "CANCELLED_REASON",
    "RESTARTED_REASON",
    "ROLE_RESTARTED_REASON",
    "MasterService",
]


class MasterService:
    """Hosts workloads of many tenants on one set of services (see module docstring).

    Args:
        base: The resident base model.
        base_model_id: Its id as specs name it.
        scheduler: The Training Scheduler (opened with ``keep_in_flight=True`` when
            workloads are durable: the Master reconciles what a dead process left).
        queue: The Training Queue.
        env: The Environment Service.
        training: The Training Model Service.
        inference: The Inference Model Service (started by the caller).
        output_root: Tenant output dirs are ``<output_root>/<tenant>``; specs' own
            ``output_dir`` is replaced by it (the server decides where artifacts go).
        limits: What the tenant creator accepts.
        clock: Time source of the loops.
        poll_s: Back-off of producers and the supervisors.
        max_failures: A workload whose jobs failed this many times ends ``failed``.
        store: Where workload records are kept (default: in memory, forgotten with
            the process; a server passes ``SQLiteWorkloadStore`` on its run dir).
        heldout_samples: Measure SFT held-out action error on this many frames at the
            start and the end of an SFT workload (None: do not).
        watchdog_factor: Flag a workload ``stalled`` after this many expected job
            times without progress.
        watchdog_min_s: ... but never before this many seconds without progress.
        restart_grace_s: How long a finishing workload waits for a service that
            answers unavailable (a role the Health Manager is restarting).
    """

    def __init__(
        self,
        *,
        base: ResidentBaseModel,
        base_model_id: str,
        scheduler: TrainingScheduler,
        queue: TrainingQueueAPI,
        env: EnvironmentServiceAPI,
        training: TrainingModelServiceAPI,
        inference: InferenceModelServiceAPI,
        output_root: Path,
        limits: MasterLimits | None = None,
        clock: Clock | None = None,
        poll_s: float = 0.05,
        max_failures: int = 5,
        store: WorkloadStore | None = None,
        heldout_samples: int | None = None,
        watchdog_factor: float = 20.0,
        watchdog_min_s: float = 120.0,
        restart_grace_s: float = 60.0,
    ) -> None:
        # Absolute: specs get it as their output_dir, and the Training Model Service
        # resolves a relative one against its own output directory (a relative run
        # directory would nest the checkpoints where recovery and init_from never look).
        self.output_root = Path(output_root).resolve()
        self.base = base
        self.base_model_id = base_model_id
        self.scheduler = scheduler
        self.queue = queue
        self.env = env
        self.training = training
        self.inference = inference
        self.limits = limits or MasterLimits()
        self.clock: Clock = clock or SystemClock()
        self.store: WorkloadStore = store or InMemoryWorkloadStore()
        self.book = WorkloadBook(
            base=base,
            base_model_id=base_model_id,
            scheduler=scheduler,
            store=self.store,
            output_root=self.output_root,
            clock=self.clock,
        )
        self.compiler = SpecCompiler(self.book, self.limits)
        #: Each tenant's disk use and quota (the server sets ``disk.limit_of``).
        self.disk = TenantDisk(self.output_root)
        self.ctx = WorkflowContext(
            scheduler=scheduler,
            queue=queue,
            training=training,
            inference=inference,
            clock=self.clock,
            tenants=self.book.tenants,
            env=env,
            domain=DOMAIN,
            poll_s=poll_s,
            durable_checkpoints=True,
            overlap_updates=True,
            in_checkpoint=lambda job: self.recovery.in_checkpoint(job),
            slot_grace_s=restart_grace_s,
            disk_check=self.disk.check_write,
        )
        settings = SupervisionSettings(
            max_failures=max_failures,
            heldout_samples=heldout_samples,
            watchdog_factor=watchdog_factor,
            watchdog_min_s=watchdog_min_s,
            restart_grace_s=restart_grace_s,
            poll_s=poll_s,
        )
        self.supervisor = Supervisor(
            self.book,
            self.ctx,
            base=base,
            queue=queue,
            env=env,
            training=training,
            inference=inference,
            settings=settings,
        )
        self.recovery = Recovery(self.book, self.compiler, self.supervisor)
        self.reporter = Reporter(self.book)
        self.lifecycle = Lifecycle(
            self.book, self.compiler, self.supervisor, self.reporter, self.limits
        )
        self.primitives = ModelPrimitives(self.book, training=training, inference=inference)
        self._loops: list[asyncio.Task[None]] = []
        self._started = False

    # ------------------------------------------------------------------ lifetime

    async def start(self) -> None:
        """Recover the stored workloads, then start the shared loops.

        Jobs a previous process left in flight are reconciled with the checkpoints
        first (:mod:`joynexus.master.recovery`), so the loops never lease a job whose
        data died with that process.
        """
        if self._started:
            return
        self._started = True
        for limit in global_limits():
            self.scheduler.set_global_limit(limit)
        await self.recovery.start()
        self._loops = launch.start_stage_loops(self.ctx, prefix="master:")

    async def aclose(self) -> None:
        """Stop every workload's loops and the shared loops; records stay as they are.

        A workload that was running is resumed by the next :meth:`start` on the same
        store (a clean restart behaves like a crash, minus the lost in-flight work).
        """
        tasks = [
            t
            for w in self.book.workloads.values()
            for t in (w.producer, w.supervisor)
            if t is not None and not t.done()
        ]
        forward = self.supervisor.actor_forward
        tasks += [*self._loops, *([forward] if forward else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loops = []
        self.supervisor.actor_forward = None
        self._started = False
