"""What each tenant's files take on the shared disk, and its disk quota.

A tenant's files are everything under ``<output_root>/<tenant>``: its checkpoints and
its workloads' folders (manifests, metrics). Without a bound, one tenant that saves
often can fill the disk every tenant writes to; so the server gives each tenant a
quota (``TenantQuotas.max_disk_bytes``), charged here as the bytes those files
allocate, and enforced in two places:

* a request that makes the tenant write more (submit a workload, ``save``) is refused
  with HTTP 429, reason ``disk_bytes``, once the tenant is past its quota;
* a running workload's next checkpoint is refused as a full disk *for that tenant*
  (:class:`~joynexus.errors.StorageFullError`): its slot rolls back, its status shows
  the fault, and it resumes by itself once it is under its quota again (an operator
  raised the quota). Other tenants are not affected.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from joynexus.errors import StorageFullError

__all__ = ["TenantDisk", "disk_usage"]


def disk_usage(path: Path) -> int:
    """Bytes the files under ``path`` allocate (0 when it does not exist).

    Links are not followed (a link inside a tenant's folder charges nothing of what it
    points to); a file that vanishes while counted (a checkpoint being pruned) counts 0.
    """
    total = 0
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            # Allocated blocks where the platform reports them (a sparse or tiny file
            # takes what the disk gives it), else the apparent size.
            total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return total


class TenantDisk:
    """Each tenant's disk use under ``output_root`` against its quota.

    Args:
        output_root: Tenant folders are ``<output_root>/<tenant>``.

    Attributes:
        limit_of: The tenant's quota in bytes, or None for none (the server sets it
            from its tenant quotas; without a server nothing is bounded).
    """

    def __init__(self, output_root: Path) -> None:
        self.output_root = output_root
        self.limit_of: Callable[[str], int | None] = lambda _tenant: None

    def usage(self, tenant_id: str) -> int:
        """Bytes the tenant's files take now."""
        return disk_usage(self.output_root / tenant_id)

    def check_write(self, tenant_id: str) -> None:
        """Refuse a workload's next write when the tenant is past its quota.

        Raises:
            StorageFullError: the tenant's files take more than its quota (its storage
                is full; the write waits like one on a full disk).
        """
        limit = self.limit_of(tenant_id)
        if limit is None:
            return
        used = self.usage(tenant_id)
        if used > limit:
            raise StorageFullError(
                f"tenant {tenant_id!r} is past its disk quota: its files take {used} "
                f"bytes of max_disk_bytes {limit}; an operator raises the quota, or the "
                "workload keeps fewer checkpoints (scheduling.keep_last)",
                tenant_id=tenant_id,
                limit=limit,
                current=used,
            )
