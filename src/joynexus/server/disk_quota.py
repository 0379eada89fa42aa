"""The per-tenant disk quota at the HTTP edge (``TenantQuotas.max_disk_bytes``).

The Master charges each tenant the bytes its files take
(:class:`~joynexus.master.disk.TenantDisk`); this module gives it the quotas the server
holds, and refuses a request that would make a tenant past its quota write more: 429,
reason ``disk_bytes``, like every other quota. Other tenants are not affected.
"""

from __future__ import annotations

import asyncio

from joynexus.errors import JoyNexusError, QuotaExceededError
from joynexus.server.state import ServerState

__all__ = ["check_disk_quota", "install_disk_quota"]

#: The machine-readable reason of the refusal (one of ``QUOTA_REASONS``).
DISK_REASON = "disk_bytes"


def install_disk_quota(state: ServerState) -> None:
    """Let the Master (if any) read each tenant's disk quota from the server's quotas."""
    master = state.services.master
    if master is None:
        return

    def limit_of(tenant_id: str) -> int | None:
        try:
            return state.quotas_of(tenant_id).max_disk_bytes
        except JoyNexusError:  # not a tenant of this server (a local run's): unbounded
            return None

    master.disk.limit_of = limit_of


async def check_disk_quota(state: ServerState, tenant_id: str) -> None:
    """Refuse the request when ``tenant_id``'s files are past its disk quota.

    Raises:
        QuotaExceededError: reason ``disk_bytes``, with ``limit`` and ``current``.
    """
    master = state.services.master
    if master is None:
        return
    limit = state.quotas_of(tenant_id).max_disk_bytes
    used = await asyncio.to_thread(master.disk.usage, tenant_id)
    if used > limit:
        raise QuotaExceededError(
            f"tenant {tenant_id!r} is past its disk quota: its files take {used} bytes of "
            f"max_disk_bytes {limit}; ask an operator to raise it, or keep fewer "
            "checkpoints (scheduling.keep_last)",
            reason=DISK_REASON,
            limit=limit,
            current=used,
        )
