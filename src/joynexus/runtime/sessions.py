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

**Per-tenant budgets.** The sessions of many tenants share this one role, so the role
never spends a budget of its own (it is registered ``self_budgeted``): each recreation
is charged to its tenant's :class:`~joynexus.runtime.budgets.RecoveryBudget` over a
sliding window. A tenant past its budget gets no new session; ``on_exhausted`` ends
that tenant's workload with a reason naming only its own session, and every other
tenant goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

from joynexus.errors import ServiceUnavailableError
from joynexus.runtime.budgets import RecoveryBudget
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
        budget: Recreations per tenant per window (default: the Health Manager's
            ``default_budget`` over its ``window_s``).
        on_exhausted: Called with a tenant whose budget is spent and the reason (the
            Master fails that tenant's workload); None: its session stays closed.
    """

    def __init__(
        self,
        env: EnvironmentServiceAPI,
        tenants: Callable[[], Iterable[WorkflowTenant]],
        health: HealthManager,
        *,
        role: str = ENVIRONMENT_ROLE,
        budget: RecoveryBudget | None = None,
        on_exhausted: Callable[[WorkflowTenant, str], Awaitable[object]] | None = None,
    ) -> None:
        self.env = env
        self.tenants = tenants
        self.health = health
        self.role = role
        self.budget = budget or RecoveryBudget(health.default_budget, health.window_s, health.clock)
        self.on_exhausted = on_exhausted
        # Crashed session id -> the tenant whose session it was (awaiting recreation).
        self._down: dict[str, WorkflowTenant] = {}
        self._reports: set[asyncio.Future[bool]] = set()

    def register(self) -> None:
        """Register the role (restart + probe) and, in process, the crash hook."""
        if isinstance(self.env, EnvironmentService):  # not an actor proxy
            self.env.on_crash = self.on_crash
        self.health.register(self.role, self.restart, probe=self.probe, self_budgeted=True)

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
        """Recreate every crashed session with its tenant's spec (same tenant, new id),
        within each tenant's budget; a tenant past it is handed to ``on_exhausted``."""
        for sid in self.crashed():
            tenant = self._down[sid]
            assert tenant.spec.env is not None
            with contextlib.suppress(Exception):
                await self.env.close(sid, tenant_id=tenant.tenant_id)
            if not self.budget.charge(tenant.tenant_id):
                del self._down[sid]
                await self._exhausted(tenant, sid)
                continue
            # A failed create leaves the session marked: the next probe retries it.
            session = await self.env.create_session(tenant.tenant_id, tenant.spec.env)
            tenant.session_id = session.session_id
            del self._down[sid]
            tenant.metrics.write("session_restarted", old=sid, new=session.session_id)

    async def _exhausted(self, tenant: WorkflowTenant, session_id: str) -> None:
        # Only this tenant's own ids: the reason is shown to the tenant.
        reason = (
            f"recovery budget spent: simulator session {session_id} crashed again after "
            f"{self.budget.used(tenant.tenant_id)} restarts within the window "
            f"(budget {self.budget.describe()} per tenant)"
        )
        self.health.record(self.role, "budget_exhausted", f"tenant {tenant.tenant_id}: {reason}")
        tenant.metrics.write("session_budget_spent", session=session_id)
        if self.on_exhausted is not None:
            await self.on_exhausted(tenant, reason)
