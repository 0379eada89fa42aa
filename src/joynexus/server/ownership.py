"""Which tenant owns which Training Queue partition.

A partition belongs to the tenant that created it: through a scheduler reservation
(the job's ``partition_id``; its ``tenant_id`` is the owner) or through a first
``queue_put`` to an unused name. The registry remembers claims made over HTTP and
falls back to the scheduler for partitions of jobs created elsewhere (by workloads
the Master runs in process, or before a restart). A partition that exists in the
queue but that nobody can vouch for is nobody's over HTTP.

The tenant gateway (:mod:`joynexus.server.gateway`) turns an owner into an answer:
another tenant's partition answers exactly as an unknown one. The one difference left
is inherent to names a tenant chooses: ``queue_put`` to a name another tenant already
uses answers 409 (the name is taken), not 201.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from joynexus.errors import (
    ConflictError,
    InvalidRequestError,
)

if TYPE_CHECKING:  # the Training Queue module imports torch; the server must not
    from joynexus.control.scheduler import TrainingScheduler
    from joynexus.services.protocols import TrainingQueueAPI

__all__ = ["SCHEDULER_PARTITION_PREFIX", "PartitionOwnership"]

#: Prefix of partition ids the scheduler derives; tenants cannot create such names by
#: ``queue_put`` (they must reserve a job), so no tenant can squat a future job's id.
SCHEDULER_PARTITION_PREFIX = "part-"

_NOBODY = ""


def _derived_only(partition_id: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"partition ids starting with {SCHEDULER_PARTITION_PREFIX!r} are derived by the "
        "Training Scheduler; reserve a job to get one, or choose another name",
        partition_id=partition_id,
    )


def _taken(partition_id: str) -> ConflictError:
    return ConflictError(
        f"training-queue partition name {partition_id!r} is taken; choose another name",
        partition_id=partition_id,
    )


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

    def check_put(self, partition_id: str, tenant_id: str) -> bool:
        """May ``tenant_id`` ``queue_put`` to ``partition_id``? True if it is a new one.

        Raises:
            InvalidRequestError: a scheduler-derived id that is not one of the tenant's
                jobs (another tenant's job answers exactly like a made-up id).
            ConflictError: a name another tenant (or nobody we can vouch for) uses.
        """
        owner = self.owner(partition_id)
        if owner == tenant_id:
            return False
        if partition_id.startswith(SCHEDULER_PARTITION_PREFIX):
            raise _derived_only(partition_id)
        if owner is not None:
            raise _taken(partition_id)
        return True

    def claim(self, partition_id: str, tenant_id: str) -> None:
        """Own ``partition_id`` for a ``queue_put``: the tenant's already, or a new name.

        Raises:
            InvalidRequestError / ConflictError: see :meth:`check_put`.
        """
        if not self.check_put(partition_id, tenant_id):
            return
        with self._lock:
            current = self._owners.setdefault(partition_id, tenant_id)
        if current != tenant_id:
            raise _taken(partition_id)

    def partitions_of(self, tenant_id: str) -> list[str]:
        """Partitions the tenant owns that still exist in the queue."""
        with self._lock:
            mine = dict.fromkeys(p for p, t in self._owners.items() if t == tenant_id)
        mine.update(dict.fromkeys(j.partition_id for j in self._scheduler.list_jobs(tenant_id)))
        return [p for p in mine if self._queue.has_partition(p)]
