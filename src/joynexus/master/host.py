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
* the training role restarts in place through :meth:`MasterService.restart_training`
  (every live tenant's slot rebuilt from its latest checkpoint);
* a role past its recovery budget (or a shared role that cannot restart) escalates:
  :meth:`MasterService.fail_live` ends every live workload ``failed`` with the reason,
  and :meth:`MasterHost.degraded` reports it (``/readyz`` answers 503 with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from joynexus.master.limits import MasterLimits
from joynexus.master.service import MasterService
from joynexus.master.store import WorkloadStore
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
                session_holders=self.master.session_holders,
                restart_training=self.master.restart_training,
            )
            health.on_global_restart = self._global_restart
        self._health_task: asyncio.Task[None] | None = None
        self._started = False

    async def _global_restart(self, reason: str) -> None:
        ended = await self.master.fail_live(f"global_restart: {reason}")
        log.error("recovery budget spent (%s): failed workloads %s", reason, ended)

    def degraded(self) -> list[str]:
        """Why the service is not fully healthy (empty when it is): an escalated role,
        stalled workloads."""
        why = []
        if self.health is not None and self.health.escalated is not None:
            why.append(f"global restart: {self.health.escalated}")
        return why + self.master.degraded()

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
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
            self._health_task = None
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
