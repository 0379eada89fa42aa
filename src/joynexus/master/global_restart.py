"""The global restart (paper §4.1.3): rebuild the plane, resume every live workload.

When a role the Health Manager cannot repair in place escalates (a shared coordination
component, or a role past its recovery budget), failing every live workload at once
would throw away work that sits safe in the checkpoints. Instead every live workload
is stopped, the plane is rebuilt (what the placement can redeploy: engines restarted,
simulator sessions closed), and each workload is resumed from its tenant's latest
checkpoint — the same path a restarted server takes — within its own restart budget
(:attr:`Supervisor.workload_restarts`). Only a workload past that budget, or every
one when the rebuild itself fails, ends ``failed`` with ``global_restart: <why>``; an
operator may resume such a workload later
(:meth:`~joynexus.master.lifecycle.Lifecycle.resume`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from joynexus.master.faults import GLOBAL_RESTART
from joynexus.master.service import MasterService
from joynexus.runtime.health import HealthManager

__all__ = ["global_restart"]

log = logging.getLogger(__name__)


async def global_restart(
    master: MasterService,
    health: HealthManager | None,
    reason: str,
    rebuild: Callable[[], Awaitable[None]] | None = None,
) -> tuple[list[str], list[str]]:
    """Rebuild the plane and resume the live workloads (see module docstring).

    Args:
        master: The Master whose live workloads are restarted.
        health: The Health Manager that escalated: once something was resumed, its
            roles count as healthy again (a rebuilt plane) and readiness turns green.
        reason: Why it escalated (recorded in the errors of the workloads failed).
        rebuild: Redeploys the plane's services (None: nothing to redeploy).

    Returns:
        The ids of the workloads resumed and of those failed.
    """
    try:
        resumed, failed = await _restart_live(master, reason, rebuild)
    except Exception as error:  # the plane could not be rebuilt: nothing can run
        log.error("global restart failed (%s): %s", reason, error)
        why = f"{GLOBAL_RESTART} {reason} (the rebuild failed: {error})"
        return [], await master.supervisor.fail_live(why)
    log.warning("global restart (%s): resumed %s, failed %s", reason, resumed, failed)
    if resumed and health is not None:
        health.recovered(f"resumed {len(resumed)} workloads from their checkpoints")
    return resumed, failed


async def _restart_live(
    master: MasterService, reason: str, rebuild: Callable[[], Awaitable[None]] | None
) -> tuple[list[str], list[str]]:
    sup = master.supervisor
    live = master.book.live()
    for w in live:  # halted first: nothing runs on the plane while it is rebuilt
        await sup.halt(w)
    if rebuild is not None:
        await rebuild()
    resumed, failed = [], []
    for w in live:
        if sup.workload_restarts.charge(w.workload_id):
            sup.relaunch(w, "resumed_after_global_restart")
            resumed.append(w.workload_id)
            continue
        spent = f"its restarts spent: {sup.workload_restarts.describe()}"
        await sup.end_failed(w, f"{GLOBAL_RESTART} {reason} ({spent})"[:500])
        failed.append(w.workload_id)
    return resumed, failed
