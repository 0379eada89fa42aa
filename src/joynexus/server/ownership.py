"""Which tenant owns which Training Queue partition.

A partition belongs to the tenant that created it: through a scheduler reservation
(the job's ``partition_id``; its ``tenant_id`` is the owner) or through a first
``queue_put`` to an unused name. The registry remembers claims made over HTTP and
falls back to the scheduler for partitions of jobs created elsewhere (by workloads
the Master runs in process, or before a restart). A partition that exists in the
queue but that nobody can vouch for is nobody's over HTTP: touching it answers 403.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from joynexus.errors import InvalidRequestError, PermissionDeniedError

if TYPE_CHECKING:  # the Training Queue module imports torch; the server must not
    from joynexus.control.scheduler import TrainingScheduler
    from joynexus.services.protocols import TrainingQueueAPI

__all__ = ["SCHEDULER_PARTITION_PREFIX", "PartitionOwnership"]

#: Prefix of partition ids the scheduler derives; tenants cannot create such names by
#: ``queue_put`` (they must reserve a job), so no tenant can squat a future job's id.
SCHEDULER_PARTITION_PREFIX = "part-"

_NOBODY = ""


class PartitionOwnership:
    """Owner lookups and claims for Training Queue partitions.

    Args:
        scheduler: Consulted for partitions of jobs the registry has not seen.
        queue: Tells whether an unclaimed partition already exists.
    """

    def __init__(self, scheduler: TrainingScheduler, queue: TrainingQueueAPI) -> None:
        self._scheduler = scheduler
        self._queue = queue
        self._owners: dict[str, str] = {}
        self._lock = threading.Lock()

    def record_job(self, partition_id: str, tenant_id: str) -> None:
        """Remember the partition of a job the tenant just reserved."""
        with self._lock:
            self._owners[partition_id] = tenant_id

    def owner(self, partition_id: str) -> str | None:
        """The owning tenant, ``""`` for a partition nobody can vouch for, None if unused."""
        with self._lock:
            known = self._owners.get(partition_id)
        if known is not None:
            return known
        for job in self._scheduler.list_jobs():
            if job.partition_id == partition_id:
                with self._lock:
                    self._owners[partition_id] = job.tenant_id
                return job.tenant_id
        return _NOBODY if self._queue.has_partition(partition_id) else None

    def require(self, partition_id: str, tenant_id: str) -> None:
        """Raise PermissionDeniedError unless ``tenant_id`` owns the (existing) partition.

        An unused name passes: the queue then answers ``partition_not_found``.
        """
        owner = self.owner(partition_id)
        if owner is not None and owner != tenant_id:
            raise PermissionDeniedError(
                f"training-queue partition {partition_id!r} belongs to another tenant",
                partition_id=partition_id,
            )

    def claim(self, partition_id: str, tenant_id: str) -> None:
        """Own ``partition_id`` for a ``queue_put``: the tenant's already, or a new name.

        Raises:
            PermissionDeniedError: another tenant owns it (or nobody can vouch for it).
            InvalidRequestError: a new name with the scheduler's reserved prefix.
        """
        owner = self.owner(partition_id)
        if owner == tenant_id:
            return
        if owner is not None:
            raise PermissionDeniedError(
                f"training-queue partition {partition_id!r} belongs to another tenant",
                partition_id=partition_id,
            )
        if partition_id.startswith(SCHEDULER_PARTITION_PREFIX):
            raise InvalidRequestError(
                f"partition ids starting with {SCHEDULER_PARTITION_PREFIX!r} are derived by the "
                "Training Scheduler; reserve a job to get one, or choose another name",
                partition_id=partition_id,
            )
        with self._lock:
            current = self._owners.setdefault(partition_id, tenant_id)
        if current != tenant_id:
            raise PermissionDeniedError(
                f"training-queue partition {partition_id!r} belongs to another tenant",
                partition_id=partition_id,
            )

    def partitions_of(self, tenant_id: str) -> list[str]:
        """Partitions the tenant owns that still exist in the queue."""
        with self._lock:
            mine = dict.fromkeys(p for p, t in self._owners.items() if t == tenant_id)
        mine.update(dict.fromkeys(j.partition_id for j in self._scheduler.list_jobs(tenant_id)))
        return [p for p in mine if self._queue.has_partition(p)]
