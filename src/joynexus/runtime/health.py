"""The Health Manager (paper §4.1.3, "Fault isolation and partial restart").

Every resident role registers with a ``restart`` coroutine (terminate and redeploy the
role in its own allocation, restoring it from recorded progress) and, optionally, a
``probe`` (a cheap liveness call). The manager learns about failures in three ways:

* **heartbeats**: a role (or its probe) calls :meth:`HealthManager.heartbeat`; a role
  silent for longer than its ``heartbeat_timeout_s`` is declared failed;
* **probes**: :meth:`HealthManager.check` runs every probe; a probe that raises is a
  failure (a dead Ray actor raises ``RayActorError`` here);
* **error reports**: a caller that saw a role fail calls :meth:`report_error`.

On a failure only that role is restarted; other roles and tenants keep running. Each
role has a recovery budget of restarts per sliding window
(:class:`~joynexus.runtime.budgets.RecoveryBudget`: it refills as old restarts leave
the window); past it, or for a role marked ``shared`` (a coordination component whose
loss affects everyone), the manager escalates to a global restart through
``on_global_restart``. A role that serves many tenants (the simulator sessions) is
registered ``self_budgeted``: it charges per-tenant budgets itself and never spends a
budget shared by every tenant. Every step is recorded as a :class:`HealthEvent`.
Concurrent reports of the same failure are coalesced into one restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from joynexus.errors import ConflictError, NotFoundError
from joynexus.runtime.budgets import DEFAULT_WINDOW_S, RecoveryBudget
from joynexus.utils.clock import Clock, SystemClock

__all__ = ["HealthEvent", "HealthEventKind", "HealthManager", "RoleHealth", "RoleState"]

log = logging.getLogger(__name__)

HealthEventKind = Literal[
    "registered",
    "heartbeat_missed",
    "probe_failed",
    "error_reported",
    "restart_started",
    "restarted",
    "restart_failed",
    "budget_exhausted",
    "global_restart",
]
RoleState = Literal["healthy", "recovering", "failed"]


class HealthEvent(BaseModel):
    """One recorded health event."""

    model_config = ConfigDict(extra="forbid")

    seq: int
    time: float
    role: str
    kind: HealthEventKind
    detail: str = ""
    restarts: int = 0


class RoleHealth(BaseModel):
    """A role's current health, as :meth:`HealthManager.status` reports it."""

    model_config = ConfigDict(extra="forbid")

    role: str
    state: RoleState
    restarts: int
    budget: int
    last_heartbeat: float
    shared: bool


@dataclass
class _Role:
    name: str
    restart: Callable[[], Awaitable[None]]
    probe: Callable[[], Awaitable[None]] | None
    budget: int
    window: RecoveryBudget
    heartbeat_timeout_s: float | None
    shared: bool
    self_budgeted: bool
    last_heartbeat: float
    state: RoleState = "healthy"
    restarts: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class HealthManager:
    """Monitors roles and restarts the failed one in place (see module docstring).

    Args:
        clock: Time of heartbeats and events (tests pass a ``FakeClock``).
        default_budget: Restarts a role may use within ``window_s`` before escalation.
        window_s: The sliding window of the budgets (None: the process's whole life).
        heartbeat_timeout_s: Default silence after which a role counts as failed
            (None: heartbeats are not required, only probes and reports count).
        check_interval_s: Period of :meth:`run`.
        on_global_restart: Called once with the reason when the manager escalates.
    """

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        default_budget: int = 3,
        window_s: float | None = DEFAULT_WINDOW_S,
        heartbeat_timeout_s: float | None = 30.0,
        check_interval_s: float = 1.0,
        on_global_restart: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.default_budget = default_budget
        self.window_s = window_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.check_interval_s = check_interval_s
        self.on_global_restart = on_global_restart
        self.events: list[HealthEvent] = []
        self.escalated: str | None = None
        self._roles: dict[str, _Role] = {}

    # ------------------------------------------------------------------ roles

    def register(
        self,
        role: str,
        restart: Callable[[], Awaitable[None]],
        *,
        probe: Callable[[], Awaitable[None]] | None = None,
        budget: int | None = None,
        heartbeat_timeout_s: float | None = None,
        shared: bool = False,
        self_budgeted: bool = False,
    ) -> None:
        """Watch ``role``.

        Args:
            role: Unique name (``"inference/0"``, ``"environment"``, ...).
            restart: Terminates and redeploys the role, restoring its state.
            probe: Raises if the role is not alive.
            budget: Restarts before escalation (default: the manager's).
            heartbeat_timeout_s: Overrides the manager's default for this role.
            shared: A coordination component: any failure escalates at once.
            self_budgeted: The role's restart charges finer budgets itself (per
                tenant) and fails only what spent them; the role never escalates.

        Raises:
            ConflictError: the role is already registered.
        """
        if role in self._roles:
            raise ConflictError(f"health role {role!r} is already registered")
        limit = self.default_budget if budget is None else budget
        self._roles[role] = _Role(
            name=role,
            restart=restart,
            probe=probe,
            budget=limit,
            window=RecoveryBudget(limit, self.window_s, self.clock),
            self_budgeted=self_budgeted,
            heartbeat_timeout_s=heartbeat_timeout_s
            if heartbeat_timeout_s is not None
            else self.heartbeat_timeout_s,
            shared=shared,
            last_heartbeat=self.clock.now(),
        )
        self._record(role, "registered")

    def unregister(self, role: str) -> None:
        self._roles.pop(role, None)

    def roles(self) -> list[str]:
        return list(self._roles)

    def _role(self, role: str) -> _Role:
        try:
            return self._roles[role]
        except KeyError:
            raise NotFoundError(
                f"health role {role!r} is not registered; roles: {sorted(self._roles)}"
            ) from None

    def status(self) -> list[RoleHealth]:
        return [
            RoleHealth(
                role=r.name,
                state=r.state,
                restarts=r.restarts,
                budget=r.budget,
                last_heartbeat=r.last_heartbeat,
                shared=r.shared,
            )
            for r in self._roles.values()
        ]

    def events_of(self, role: str) -> list[HealthEvent]:
        return [e for e in self.events if e.role == role]

    def record(self, role: str, kind: HealthEventKind, detail: str = "") -> None:
        """Record an event a role's own recovery decided (e.g. a tenant's budget spent)."""
        self._record(role, kind, detail)

    def _record(self, role: str, kind: HealthEventKind, detail: str = "") -> None:
        r = self._roles.get(role)
        event = HealthEvent(
            seq=len(self.events),
            time=self.clock.now(),
            role=role,
            kind=kind,
            detail=detail[:500],
            restarts=r.restarts if r is not None else 0,
        )
        self.events.append(event)
        if kind not in ("registered", "restarted"):
            log.warning("health: %s %s %s", role, kind, detail)

    # ------------------------------------------------------------------ signals

    def heartbeat(self, role: str) -> None:
        """``role`` is alive now."""
        self._role(role).last_heartbeat = self.clock.now()

    async def report_error(self, role: str, error: BaseException | str) -> bool:
        """``role`` failed: restart it (or escalate). Returns True if it is healthy again.

        A report that arrives while the role is already recovering waits for that
        recovery instead of restarting it a second time.
        """
        r = self._role(role)
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self._record(role, "error_reported", text)
        return await self._recover(r, text)

    async def check(self) -> None:
        """Probe every role and enforce heartbeat timeouts (one pass)."""
        for r in list(self._roles.values()):
            if r.state != "healthy" or r.lock.locked():
                continue
            if r.probe is not None:
                try:
                    await r.probe()
                except Exception as error:
                    text = f"{type(error).__name__}: {error}"
                    self._record(r.name, "probe_failed", text)
                    await self._recover(r, text)
                    continue
                r.last_heartbeat = self.clock.now()
            elif r.heartbeat_timeout_s is not None:
                silent = self.clock.now() - r.last_heartbeat
                if silent > r.heartbeat_timeout_s:
                    text = f"no heartbeat for {silent:.1f} s (timeout {r.heartbeat_timeout_s} s)"
                    self._record(r.name, "heartbeat_missed", text)
                    await self._recover(r, text)

    async def run(self) -> None:
        """Check every ``check_interval_s`` until cancelled."""
        while True:
            await self.clock.sleep(self.check_interval_s)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the monitor itself must not die with a role
                log.warning("health check failed: %s", error)

    # ------------------------------------------------------------------ recovery

    async def _recover(self, r: _Role, reason: str) -> bool:
        if r.lock.locked():  # coalesce: someone is already restarting this role
            async with r.lock:
                return r.state == "healthy"
        async with r.lock:
            if r.state == "failed":
                return False
            # A self-budgeted role charges its tenants' budgets in its restart instead.
            if r.shared or not (r.self_budgeted or r.window.charge()):
                why = (
                    "shared coordination component"
                    if r.shared
                    else f"recovery budget spent ({r.window.describe()})"
                )
                self._record(r.name, "budget_exhausted", f"{why}: {reason}")
                r.state = "failed"
                await self._escalate(f"{r.name}: {why} ({reason})")
                return False
            r.state = "recovering"
            r.restarts += 1
            self._record(r.name, "restart_started", reason)
            try:
                await r.restart()
            except Exception as error:
                self._record(r.name, "restart_failed", f"{type(error).__name__}: {error}")
                r.state = "healthy"  # the next probe / report tries again (budget permitting)
                return False
            r.state = "healthy"
            r.last_heartbeat = self.clock.now()
            used = "per tenant" if r.self_budgeted else f"{r.window.used()} used"
            self._record(
                r.name, "restarted", f"restart {r.restarts} ({used}, {r.window.describe()})"
            )
            return True

    def recovered(self, detail: str = "") -> None:
        """A global restart rebuilt the plane: every role is healthy again with a
        fresh budget, and the escalation is over (the next one escalates again)."""
        now = self.clock.now()
        for r in self._roles.values():
            r.state, r.last_heartbeat = "healthy", now
            r.window.forget("")
        self._record("*", "restarted", f"global restart done ({self.escalated}): {detail}")
        self.escalated = None

    async def _escalate(self, reason: str) -> None:
        if self.escalated is not None:
            return
        self.escalated = reason
        self._record("*", "global_restart", reason)
        if self.on_global_restart is not None:
            await self.on_global_restart(reason)
