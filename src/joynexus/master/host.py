"""The Master Service on an execution plane: what ``joynexus run`` and ``serve`` share.

:class:`MasterHost` builds the :class:`~joynexus.master.service.MasterService` over a
plane's services and a durable workload store, wires the plane's health roles to it
once (:func:`~joynexus.runtime.plane.watch_plane`), and owns the start / stop order of
the whole stack. The in-process run (:mod:`joynexus.master.run`) and the HTTP server
(:mod:`joynexus.server.serve`) host this very object, so recovery, self-healing and
shutdown behave the same under both.

Health wiring:

* a crashed simulator session is recreated for the tenant that holds it, and a failed
  rollout engine is restarted in place (both inside :func:`watch_plane`);
* the training role restarts in place through :meth:`Recovery.restart_training`
  (every live tenant's slot rebuilt from its latest checkpoint);
* a crashed session past its tenant's budget fails that tenant's workload only
  (:meth:`Supervisor.fail_holder`);
* a role past its recovery budget (or a shared role that cannot restart) escalates to
  a global restart (:func:`~joynexus.master.global_restart.global_restart`): the plane
  is stopped and started again and every live workload resumes from its checkpoints
  within its own restart budget; only a workload past it ends ``failed``, and
  :meth:`MasterHost.readiness` reports the escalation until something resumed
  (``/readyz`` answers 503, naming no ids).

A stalled workload is that workload's state (its status says so), not the server's:
:meth:`MasterHost.readiness` reports only how many there are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from joynexus.master.global_restart import global_restart
from joynexus.master.limits import MasterLimits
from joynexus.master.service import MasterService
from joynexus.master.store import WorkloadStore
from joynexus.runtime.budgets import RecoveryBudget
from joynexus.runtime.health import HealthManager
from joynexus.runtime.hosting import RuntimeConfig
from joynexus.runtime.plane import ExecutionPlane, watch_plane
from joynexus.utils.clock import Clock, SystemClock

__all__ = ["MasterHost"]

log = logging.getLogger(__name__)


class MasterHost:
    """A Master Service over ``plane``, watched by ``health`` (see module docstring).

    Args:
        plane: The execution plane (built, not started); its scheduler must have been
            opened with ``keep_in_flight=True`` so the Master reconciles those jobs.
        store: The durable workload store (the run directory's SQLite database).
        output_root: Where each tenant's checkpoints and records go
            (``<output_root>/<tenant>``).
        limits: What the Master accepts.
        config: Loop knobs (poll period, failure budget, held-out frames, watchdog).
        clock: Time source.
        health: The Health Manager to wire (None: no self-healing, e.g. unit tests).
    """

    def __init__(
        self,
        plane: ExecutionPlane,
        *,
        store: WorkloadStore,
        output_root: Path,
        limits: MasterLimits | None = None,
        config: RuntimeConfig | None = None,
        clock: Clock | None = None,
        health: HealthManager | None = None,
    ) -> None:
        cfg = config or RuntimeConfig()
        self.plane = plane
        self.clock: Clock = clock or SystemClock()
        self.health = health
        self.master = MasterService(
            base=plane.base,
            base_model_id=plane.base_model_id,
            scheduler=plane.scheduler,
            queue=plane.queue,
            env=plane.env,
            training=plane.training,
            inference=plane.inference,
            output_root=output_root,
            limits=limits,
            clock=self.clock,
            poll_s=cfg.poll_s,
            max_failures=cfg.max_failures_per_tenant,
            store=store,
            heldout_samples=cfg.heldout_samples,
            watchdog_factor=cfg.watchdog_factor,
            watchdog_min_s=cfg.watchdog_min_s,
        )
        if health is not None:
            watch_plane(
                health,
                plane,
                session_holders=self.master.reporter.session_holders,
                restart_training=self.master.recovery.restart_training,
                fail_holder=self.master.supervisor.fail_holder,
            )
            health.on_global_restart = self._global_restart
            # Each workload resumes from as many global restarts as a role may restart.
            self.master.supervisor.workload_restarts = RecoveryBudget(
                health.default_budget, health.window_s, self.clock
            )
        self._health_task: asyncio.Task[None] | None = None
        self._restart_task: asyncio.Task[object] | None = None
        self._started = False

    async def _global_restart(self, reason: str) -> None:
        # In a task of its own: the escalation may come from a loop the restart stops.
        if self._restart_task is not None and not self._restart_task.done():
            return
        self._restart_task = asyncio.create_task(
            global_restart(self.master, self.health, reason, self._rebuild),
            name="master:global-restart",
        )

    async def _rebuild(self) -> None:
        await self.plane.stop()
        await self.plane.start()

    def degraded(self) -> list[str]:
        """Why the service is not fully healthy (empty when it is): an escalated role,
        stalled workloads."""
        why = []
        if self.health is not None and self.health.escalated is not None:
            why.append(f"global restart: {self.health.escalated}")
        return why + self.master.reporter.degraded()

    def readiness(self) -> tuple[str | None, dict[str, int]]:
        """What an unauthenticated probe may learn: why the plane is not ready (None when
        it is; no tenant's ids), and counts (stalled workloads do not fail readiness:
        one tenant's stuck workload must not turn the whole server red)."""
        down = None
        if self.health is not None and self.health.escalated is not None:
            down = (
                "a role spent its recovery budget: a global restart is resuming the live "
                "workloads, or they failed past their own restart budgets"
            )
        return down, {"stalled_workloads": len(self.master.reporter.degraded())}

    async def start(self) -> None:
        """Start monitoring, the services, the Master (which recovers the stored
        workloads) and the Health Manager."""
        if self._started:
            return
        self._started = True
        if self.plane.metrics is not None:
            self.plane.metrics.start()
        await self.plane.start()
        await self.master.start()
        if self.health is not None:
            self._health_task = asyncio.create_task(self.health.run(), name="master:health")

    async def stop(self) -> None:
        """Stop the Health Manager, the Master's loops (records stay as they are: the
        next start resumes them) and the services; persist usage. Idempotent."""
        if not self._started:
            return
        self._started = False
        for task in (self._health_task, self._restart_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._health_task = self._restart_task = None
        try:
            await self.master.aclose()
        finally:
            with contextlib.suppress(Exception):
                await self.plane.stop()
            if self.plane.metrics is not None:
                self.plane.metrics.stop()
            if self.plane.usage is not None:
                with contextlib.suppress(OSError):
                    self.plane.usage.save()

    def close(self) -> None:
        """Release what the placement reserved and close the scheduler and the
        workload store (after :meth:`stop`)."""
        try:
            self.master.store.close()
        finally:
            self.plane.close()
