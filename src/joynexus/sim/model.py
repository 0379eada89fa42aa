"""The simulated services around the *real* Training Scheduler.

Every admission, ordering, lease, staleness and state decision below is a call into
:class:`~joynexus.control.scheduler.TrainingScheduler` running on the engine's
:class:`~joynexus.sim.engine.SimClock`; this module only supplies durations.

Processes (one generator each, see :mod:`joynexus.sim.engine`):

* **RL producer** (per tenant, Appendix A.4): ``reserve`` with the tenant's current
  policy version → ``horizon`` × (environment step, then one inference request of
  ``num_envs`` samples) → ``mark(needs_advantages)``. A refused reservation waits for
  the scheduler-changed signal (fired on every mark/complete/drop), never polls.
* **Advantage worker** (per actor replica, Appendix A.5): ``lease_stage(needs_advantages
  → computing_advantages)`` → fixed CPU time → ``mark(ready)``. It uses no model GPU.
* **SFT producer** (per tenant): ``reserve`` (bounded by ``max_in_flight``, the
  prefetch bound) → dataloader time → ``mark(ready)``.
* **Inference server** (per inference GPU, §4.3): when the queue is non-empty it waits
  until the oldest request has waited ``max_wait_s`` or the queue holds
  ``max_batch_samples``, takes the FIFO prefix that fits the cap (a request larger
  than the cap runs alone as several batches), is busy for ``base_s + per_sample_s·n``,
  then answers every request in it. All requests share one frozen-prefix interface.
* **Actor** (per replica, Appendix A.6): ``lease_next`` → Eq. (1) via
  ``TrainingScheduler.is_stale`` against the tenant's current version → ``drop`` or
  train ``ceil(samples / (per_gpu_microbatch · actor_gpus))`` microbatches →
  ``complete``. The tenant's version advances by that many microbatch updates.

Modelling assumptions: environment-pool contention is a slowdown factor
``1 + contention · (others stepping in the pool)`` fixed at the start of each step;
policy publication to inference is instantaneous at ``complete``; leases are
heartbeated every quarter TTL of simulated time, so none expires in a healthy run.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from joynexus.control.admission import AdmissionPolicy, GlobalLimit
from joynexus.control.job import JobState, TaskType, TrainingJob
from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import InternalError
from joynexus.sim.engine import Engine, Event, ProcessGen, Timeout, WaitSignal
from joynexus.sim.scenario import Deployment, RLSpec, Scenario, SFTSpec

DOMAIN = "vla"


@dataclass(slots=True)
class UpdateRecord:
    """One actor lease: a completed update, or a drop (``dropped=True``)."""

    job_id: str
    tenant_id: str
    task_type: str
    actor: str
    created_seq: int
    ready_seq: int | None
    priority: int
    sample_count: int
    microbatches: int
    behavior_version: int | None
    actor_version: int  # the tenant's version when the actor leased the job
    leased_at: float
    finished_at: float
    dropped: bool = False


@dataclass(slots=True)
class RunResult:
    """What one simulation run observed (times in simulated seconds)."""

    end_time: float
    actor_gpus_per_replica: int
    replicas: tuple[str, ...]
    inference_gpus: int
    actor_busy: dict[str, list[tuple[float, float]]]
    inference_busy: list[list[tuple[float, float]]]
    updates: list[UpdateRecord]
    drops: list[UpdateRecord]
    rollouts: dict[str, int]
    inference_batches: int
    inference_samples: int
    max_active_rollouts: int
    max_active_rollouts_per_tenant: dict[str, int]
    refusals: dict[str, int]
    counters: dict[str, Any]
    violations: list[str]
    events: int
    final_versions: dict[str, int]
    jobs: list[TrainingJob] = field(default_factory=list)

    def training_utilization(self, until: float) -> float:
        """Actor busy time in ``[0, until]`` per actor GPU, over ``until``."""
        if until <= 0:
            return 0.0
        busy = sum(_clipped(iv, until) for iv in self.actor_busy.values())
        return busy / (until * len(self.replicas))

    def inference_utilization(self, until: float) -> float:
        """Inference busy time in ``[0, until]`` per inference GPU, over ``until``."""
        if until <= 0:
            return 0.0
        busy = sum(_clipped(iv, until) for iv in self.inference_busy)
        return busy / (until * self.inference_gpus)


def timeline(groups: list[list[tuple[float, float]]], until: float, bin_s: float) -> list[float]:
    """Busy fraction per ``bin_s`` bin of ``[0, until]``, averaged over ``groups``
    (one interval list per GPU or replica) — the data of a utilization-over-time plot."""
    if until <= 0 or not groups:
        return []
    n = max(1, math.ceil(until / bin_s))
    busy = [0.0] * n
    for intervals in groups:
        for s, e in intervals:
            e = min(e, until)
            while s < e:
                k = min(int(s // bin_s), n - 1)
                edge = min(e, (k + 1) * bin_s)
                busy[k] += edge - s
                s = edge
    widths = [min(bin_s, until - k * bin_s) for k in range(n)]
    return [b / (w * len(groups)) if w > 0 else 0.0 for b, w in zip(busy, widths, strict=True)]


def _clipped(intervals: list[tuple[float, float]], until: float) -> float:
    return sum(max(0.0, min(e, until) - s) for s, e in intervals if s < until)


@dataclass(slots=True)
class _Request:
    tenant_id: str
    samples: int
    arrival: float
    done: Event


@dataclass(slots=True)
class _Pool:
    contention: float
    stepping: int = 0


class Simulation:
    """One run of a :class:`Deployment` on a fresh engine and a fresh scheduler.

    Args:
        scenario: Durations and knobs.
        deployment: Tenants, pools and replicas to run.
        window_s: Multi-tenant mode: producers and actors stop taking new work after
            this time; an update already leased runs to completion.
        completion_targets: Isolated mode: per-tenant completion targets, set on the
            scheduler's admission policies; the run ends when all are reached.
        time_limit_s: Safety bound on simulated time (raises InternalError past it).
    """

    def __init__(
        self,
        scenario: Scenario,
        deployment: Deployment,
        *,
        window_s: float | None = None,
        completion_targets: dict[str, int] | None = None,
        time_limit_s: float | None = None,
    ) -> None:
        if (window_s is None) == (completion_targets is None):
            raise ValueError("give exactly one of window_s and completion_targets")
        self.sc = scenario
        self.dep = deployment
        self.window_s = window_s
        self.targets = dict(completion_targets or {})
        self.time_limit_s = time_limit_s or 1e7
        self.engine = Engine()
        knobs = scenario.scheduler
        self.sched = TrainingScheduler.in_memory(
            clock=self.engine.clock, lease_ttl_s=knobs.lease_ttl_s, max_attempts=knobs.max_attempts
        )
        self._hb_every = knobs.lease_ttl_s / 4
        self.changed = self.engine.signal("scheduler-changed")
        self.queue_changed = self.engine.signal("inference-queue")
        self._queue: deque[_Request] = deque()
        self._queued_samples = 0
        self._pools = {p.name: _Pool(p.contention) for p in deployment.pools}
        self.versions: dict[str, int] = {}
        self._stopping = False
        self._actors_running = 0
        self._active: dict[str, int] = {}
        self._active_total = 0
        self._max_active = 0
        self._max_active_per_tenant: dict[str, int] = {}
        self._leased_now: set[str] = set()
        self._completed: dict[str, int] = {}
        self._rollouts: dict[str, int] = {}
        self._updates: list[UpdateRecord] = []
        self._drops: list[UpdateRecord] = []
        self._violations: list[str] = []
        self._actor_busy: dict[str, list[tuple[float, float]]] = {
            r: [] for r in deployment.replicas
        }
        self._inf_busy: list[list[tuple[float, float]]] = [
            [] for _ in range(deployment.inference_gpus)
        ]
        self._inf_batches = 0
        self._inf_samples = 0
        self._configure()

    # ---------------------------------------------------------------- configuration

    def _configure(self) -> None:
        knobs = self.sc.scheduler
        for rl in self.dep.rl:
            tid = rl.tenant.tenant_id
            self.versions[tid] = 0
            self.sched.set_policy(
                tid,
                TaskType.RL,
                AdmissionPolicy(
                    priority=knobs.rl_priority,
                    max_in_flight=knobs.rl_max_in_flight,
                    completion_target=self.targets.get(tid),
                ),
            )
        for s in self.dep.sft:
            tid = s.tenant.tenant_id
            self.versions[tid] = 0
            self.sched.set_policy(
                tid,
                TaskType.SFT,
                AdmissionPolicy(
                    priority=knobs.sft_priority,
                    max_in_flight=knobs.sft_max_in_flight,
                    completion_target=self.targets.get(tid),
                ),
            )
        self.sched.set_global_limit(
            GlobalLimit(
                task_type=TaskType.RL,
                max_active=self.dep.max_active_rollouts,
                max_active_per_tenant=knobs.max_active_rollouts_per_tenant,
            )
        )

    # ------------------------------------------------------------------------ run

    def run(self) -> RunResult:
        """Run to the end of the window (and its last update) or to the targets."""
        eng = self.engine
        for role in self.dep.replicas:
            eng.spawn(self._actor(role), f"actor[{role}]")
            eng.spawn(self._advantage_worker(role), f"advantages[{role}]")
        for i in range(self.dep.inference_gpus):
            eng.spawn(self._inference_server(i), f"inference[{i}]")
        for rl in self.dep.rl:
            eng.spawn(self._rl_producer(rl), f"rl[{rl.tenant.tenant_id}]")
        for s in self.dep.sft:
            eng.spawn(self._sft_producer(s), f"sft[{s.tenant.tenant_id}]")
        self._actors_running = len(self.dep.replicas)
        if self.window_s is not None:
            eng.run(until=self.window_s)
            self._stopping = True
            self.changed.fire()  # idle actors wake, see the stop flag and leave
            eng.run(until=self.time_limit_s, stop=lambda: self._actors_running == 0)
            if self._actors_running:
                raise InternalError(
                    f"simulation {self.sc.name!r}: actors still busy at the time limit "
                    f"{self.time_limit_s} s"
                )
        else:
            eng.run(until=self.time_limit_s, stop=self._targets_reached)
            if not self._targets_reached():
                raise InternalError(
                    f"simulation {self.sc.name!r}: completion targets {self.targets} not "
                    f"reached by the time limit {self.time_limit_s} s (got {self._completed})"
                )
        return self._result()

    def _targets_reached(self) -> bool:
        return all(self._completed.get(t, 0) >= n for t, n in self.targets.items())

    def _result(self) -> RunResult:
        return RunResult(
            end_time=self.engine.now,
            actor_gpus_per_replica=self.dep.layout.actor_gpus,
            replicas=self.dep.replicas,
            inference_gpus=self.dep.inference_gpus,
            actor_busy=self._actor_busy,
            inference_busy=self._inf_busy,
            updates=self._updates,
            drops=self._drops,
            rollouts=dict(self._rollouts),
            inference_batches=self._inf_batches,
            inference_samples=self._inf_samples,
            max_active_rollouts=self._max_active,
            max_active_rollouts_per_tenant=dict(self._max_active_per_tenant),
            refusals=self.sched.refusals(),
            counters=self.sched.counters(),
            violations=list(self._violations),
            events=self.engine.events_processed,
            final_versions=dict(self.versions),
            jobs=self.sched.list_jobs(),
        )

    # ------------------------------------------------------------------ processes

    def _heartbeat(self, job: TrainingJob, last: float) -> float:
        now = self.engine.now
        if now - last >= self._hb_every:
            self.sched.heartbeat(job.job_id, job.lease_epoch)
            return now
        return last

    def _rl_producer(self, spec: RLSpec) -> ProcessGen:
        t = spec.tenant
        tid = t.tenant_id
        rng = random.Random(f"{self.sc.seed}:{tid}")
        pool = self._pools[t.pool]
        while not self._stopping:
            job = self.sched.reserve(
                policy_key=f"{tid}/rl",
                domain=DOMAIN,
                tenant_id=tid,
                task_type=TaskType.RL,
                sample_count=t.sample_count,
                producer_role="rollout",
                consumer_role=spec.actor,
                behavior_policy_version=self.versions[tid],
                max_policy_staleness=self.sc.scheduler.staleness_bound,
                metadata={"schema_signature": t.env},
            )
            if job is None:
                yield WaitSignal(self.changed)
                continue
            self._rollout_started(tid)
            last_hb = self.engine.now
            for _ in range(t.horizon):
                jitter = 1.0 + rng.uniform(-t.step_jitter, t.step_jitter)
                slowdown = 1.0 + pool.contention * pool.stepping
                pool.stepping += 1
                yield Timeout(t.env_step_s * slowdown * jitter)
                pool.stepping -= 1
                req = _Request(tid, t.num_envs, self.engine.now, self.engine.event())
                self._queue.append(req)
                self._queued_samples += req.samples
                self.queue_changed.fire()
                yield WaitSignal(req.done)
                last_hb = self._heartbeat(job, last_hb)
            self.sched.mark(job.job_id, JobState.NEEDS_ADVANTAGES, lease_epoch=job.lease_epoch)
            self._rollout_finished(tid)
            self.changed.fire()

    def _rollout_started(self, tid: str) -> None:
        n = self._active.get(tid, 0) + 1
        self._active[tid] = n
        self._active_total += 1
        self._max_active = max(self._max_active, self._active_total)
        self._max_active_per_tenant[tid] = max(self._max_active_per_tenant.get(tid, 0), n)

    def _rollout_finished(self, tid: str) -> None:
        self._active[tid] -= 1
        self._active_total -= 1
        self._rollouts[tid] = self._rollouts.get(tid, 0) + 1

    def _advantage_worker(self, role: str) -> ProcessGen:
        adv = {rl.tenant.tenant_id: rl.tenant.advantage_s for rl in self.dep.rl}
        while not self._stopping:
            job = self.sched.lease_stage(
                JobState.NEEDS_ADVANTAGES, role, DOMAIN, JobState.COMPUTING_ADVANTAGES
            )
            if job is None:
                yield WaitSignal(self.changed)
                continue
            yield Timeout(adv[job.tenant_id])
            self.sched.mark(job.job_id, JobState.READY, lease_epoch=job.lease_epoch)
            self.changed.fire()

    def _sft_producer(self, spec: SFTSpec) -> ProcessGen:
        t = spec.tenant
        while not self._stopping:
            job = self.sched.reserve(
                policy_key=f"{t.tenant_id}/sft",
                domain=DOMAIN,
                tenant_id=t.tenant_id,
                task_type=TaskType.SFT,
                sample_count=t.samples_per_batch,
                producer_role="sft",
                consumer_role=spec.actor,
                metadata={"schema_signature": "sft"},
            )
            if job is None:
                yield WaitSignal(self.changed)
                continue
            yield Timeout(t.load_s)
            self.sched.mark(job.job_id, JobState.READY, lease_epoch=job.lease_epoch)
            self.changed.fire()

    def _inference_server(self, index: int) -> ProcessGen:
        cfg = self.sc.inference
        queue = self._queue
        eng = self.engine
        while True:
            if not queue:
                yield WaitSignal(self.queue_changed)
                continue
            deadline = queue[0].arrival + cfg.max_wait_s
            while queue and self._queued_samples < cfg.max_batch_samples and eng.now < deadline:
                yield WaitSignal(self.queue_changed, timeout=deadline - eng.now)
            if not queue:
                continue  # another server took them meanwhile
            batch = [queue.popleft()]
            samples = batch[0].samples
            while queue and samples + queue[0].samples <= cfg.max_batch_samples:
                samples += queue[0].samples
                batch.append(queue.popleft())
            self._queued_samples -= samples
            start = eng.now
            yield Timeout(cfg.batch_time(samples))
            self._inf_busy[index].append((start, eng.now))
            self._inf_batches += 1
            self._inf_samples += samples
            for req in batch:
                req.done.fire()

    def _actor(self, role: str) -> ProcessGen:
        cfg = self.sc.actor
        global_mb = cfg.per_gpu_microbatch * self.dep.layout.actor_gpus
        try:
            while not self._stopping:
                job = self.sched.lease_next(role, [DOMAIN])
                if job is None:
                    yield WaitSignal(self.changed)
                    continue
                self._audit_lease(job, role)
                tid = job.tenant_id
                version = self.versions[tid]
                start = self.engine.now
                if job.task_type is TaskType.RL and self.sched.is_stale(job, version):
                    self.sched.drop(job.job_id, "policy_stale", lease_epoch=job.lease_epoch)
                    self._leased_now.discard(job.job_id)
                    self._drops.append(self._record(job, role, 0, version, start, dropped=True))
                    self.changed.fire()
                    continue
                steps = max(1, math.ceil(job.sample_count / global_mb))
                last_hb = start
                for _ in range(steps):
                    yield Timeout(cfg.time_per_microbatch_s)
                    last_hb = self._heartbeat(job, last_hb)
                self.versions[tid] = version + steps
                self.sched.complete(
                    job.job_id, job.lease_epoch, metadata={"actor_version": version + steps}
                )
                self._leased_now.discard(job.job_id)
                self._actor_busy[role].append((start, self.engine.now))
                self._updates.append(self._record(job, role, steps, version, start))
                self._completed[tid] = self._completed.get(tid, 0) + 1
                self.changed.fire()
        finally:
            self._actors_running -= 1

    def _record(
        self,
        job: TrainingJob,
        role: str,
        steps: int,
        version: int,
        start: float,
        *,
        dropped: bool = False,
    ) -> UpdateRecord:
        return UpdateRecord(
            job_id=job.job_id,
            tenant_id=job.tenant_id,
            task_type=job.task_type.value,
            actor=role,
            created_seq=job.created_seq,
            ready_seq=job.ready_seq,
            priority=job.priority,
            sample_count=job.sample_count,
            microbatches=steps,
            behavior_version=job.behavior_policy_version,
            actor_version=version,
            leased_at=start,
            finished_at=self.engine.now,
            dropped=dropped,
        )

    def _audit_lease(self, job: TrainingJob, role: str) -> None:
        """Record invariant violations (tests assert there are none)."""
        if job.job_id in self._leased_now:
            self._violations.append(f"job {job.job_id} leased twice at t={self.engine.now}")
        self._leased_now.add(job.job_id)
        if job.task_type is TaskType.SFT:
            waiting_rl = [
                j.job_id
                for j in self.sched.list_jobs(state=JobState.READY)
                if j.task_type is TaskType.RL and j.consumer_role == role
            ]
            if waiting_rl:
                self._violations.append(
                    f"SFT job {job.job_id} leased at t={self.engine.now} while RL jobs "
                    f"{waiting_rl} were ready"
                )
