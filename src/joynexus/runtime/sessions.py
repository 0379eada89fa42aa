"""Recovery of crashed simulator sessions: the Health Manager's ``environment`` role.

Registered by :func:`~joynexus.runtime.plane.watch_plane` (once per plane, by the
Master's host): it hands :class:`SessionRecovery` a callable listing the tenants of the
live workloads, which hold the sessions.

A crashed session is closed and recreated with the same EnvSpec, and its tenant's
``session_id`` swapped to the new one. The crash is reported the moment a call finds
the worker dead (the Environment Service's ``on_crash``) or a probe sees it
(``env.is_crashed``). Until it is recreated, an RL tenant's session is taken out of use
(``session_id = None``), so its producer backs off instead of reserving jobs against
the dead simulator (one failed job per crash).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

from joynexus.errors import ServiceUnavailableError
from joynexus.runtime.health import HealthManager
from joynexus.services.environment import EnvironmentService
from joynexus.services.protocols import EnvironmentServiceAPI
from joynexus.spec.workload import TaskKind
from joynexus.workflows.context import WorkflowTenant

__all__ = ["ENVIRONMENT_ROLE", "SessionRecovery"]

ENVIRONMENT_ROLE = "environment"


class SessionRecovery:
    """Closes and recreates crashed sessions for the tenants that own them.

    Args:
        env: The Environment Service (in process or an actor proxy).
        tenants: Lists the tenants that may hold a session now.
        health: The Health Manager crashes are reported to.
        role: The role :meth:`register` registers.
    """

    def __init__(
        self,
        env: EnvironmentServiceAPI,
        tenants: Callable[[], Iterable[WorkflowTenant]],
        health: HealthManager,
        *,
        role: str = ENVIRONMENT_ROLE,
    ) -> None:
        self.env = env
        self.tenants = tenants
        self.health = health
        self.role = role
        # Crashed session id -> the tenant whose session it was (awaiting recreation).
        self._down: dict[str, WorkflowTenant] = {}
        self._reports: set[asyncio.Future[bool]] = set()

    def register(self) -> None:
        """Register the role (restart + probe) and, in process, the crash hook."""
        if isinstance(self.env, EnvironmentService):  # not an actor proxy
            self.env.on_crash = self.on_crash
        self.health.register(self.role, self.restart, probe=self.probe)

    def _take_out_of_use(self, tenant: WorkflowTenant, session_id: str) -> bool:
        """Mark ``tenant``'s crashed session for recreation; False if it is not the
        tenant's current session (already being recreated)."""
        if tenant.session_id != session_id:
            return False
        self._down[session_id] = tenant
        if tenant.spec.task is TaskKind.RL:
            # The RL producer backs off while its session is None. An evaluator keeps
            # the id: its run fails anyway.
            tenant.session_id = None
        return True

    def on_crash(self, session_id: str, tenant_id: str, reason: str) -> None:
        """The Environment Service's ``on_crash`` hook (called in the event loop)."""
        owner = next(
            (t for t in self.tenants() if t.tenant_id == tenant_id and t.session_id == session_id),
            None,
        )
        if owner is None or not self._take_out_of_use(owner, session_id):
            return
        report = asyncio.ensure_future(
            self.health.report_error(self.role, f"session {session_id}: {reason}")
        )
        self._reports.add(report)  # keep a reference until the restart is done
        report.add_done_callback(self._reports.discard)

    def crashed(self) -> list[str]:
        """Ids of the crashed sessions awaiting recreation (probing the live ones)."""
        for t in list(self.tenants()):
            if t.session_id is not None and self.env.is_crashed(t.session_id):
                self._take_out_of_use(t, t.session_id)
        return sorted(self._down)

    async def probe(self) -> None:
        """Raises:
        ServiceUnavailableError: some session crashed."""
        crashed = self.crashed()
        if crashed:
            raise ServiceUnavailableError(f"simulator sessions {crashed} crashed")

    async def restart(self) -> None:
        """Recreate every crashed session with its tenant's spec (same tenant, new id)."""
        for sid in self.crashed():
            tenant = self._down[sid]
            assert tenant.spec.env is not None
            with contextlib.suppress(Exception):
                await self.env.close(sid, tenant_id=tenant.tenant_id)
            # A failed create leaves the session marked: the next probe retries it.
            session = await self.env.create_session(tenant.tenant_id, tenant.spec.env)
            tenant.session_id = session.session_id
            del self._down[sid]
            tenant.metrics.write("session_restarted", old=sid, new=session.session_id)
