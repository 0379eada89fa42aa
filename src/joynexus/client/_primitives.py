"""The Training Queue and Training Scheduler primitives of paper Figure 4, written once.

:class:`Primitives` builds every queue and scheduler request and hands it to
``self._run``: :class:`~joynexus.client.sync.Client` runs it and returns the result,
:class:`~joynexus.client.aio.AsyncClient` returns an awaitable of it. So each primitive
has one body for both clients (the type parameter is what a call returns: the result,
or an awaitable of it).

Training Queue (Appendix A.5), on the calling tenant's partitions:

* ``queue_put(partition_id, data, metadata)`` appends samples (``data``: field →
  ``[N, ...]`` array; ``metadata``: one ``{"schema_signature", "behavior_policy_version"}``
  for all N, or N of them); the new sample indexes.
* ``get_meta(partition_id, fields, batch_size, task_name)`` chooses up to
  ``batch_size`` samples ``task_name`` has not received: a ``BatchMeta`` mapping
  (``indexes`` empty when none is left).
* ``get_data(meta)`` the tensors of those samples (field → array, rows in ``indexes``
  order); ``put(meta, data)`` writes derived fields (advantages, returns) to them.
* ``clear(partition_id)`` releases a consumed partition.

Training Scheduler (Appendix A.2–A.6), on the calling tenant's jobs (each answer is the
job descriptor of paper Table 3 as a mapping): ``reserve``, ``mark``, ``hand_off``,
``lease_stage``, ``lease``, ``heartbeat``, ``complete``, ``fail``, ``drop``, ``job``,
``jobs``. ``lease`` and ``lease_stage`` answer ``None`` when no job waits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from joynexus.client._core import Call

__all__ = ["Primitives"]

R = TypeVar("R")

_QUEUE = "/v1/queue/partitions"
_JOBS = "/v1/scheduler/jobs"


def _epoch(lease_epoch: int | None, **body: Any) -> dict[str, Any]:
    if lease_epoch is not None:
        body["lease_epoch"] = lease_epoch
    return body


def _job_or_none(body: Any) -> dict[str, Any] | None:
    job: dict[str, Any] | None = body["job"]
    return job


def _data(body: Any) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in body["data"].items()}


def _indexes(body: Any) -> list[int]:
    return [int(i) for i in body["indexes"]]


def _arrays(data: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v) for k, v in data.items()}


def _ref(meta: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The partition and the ``get_data`` body of a ``get_meta`` answer."""
    body = {
        "indexes": [int(i) for i in meta["indexes"]],
        "fields": list(meta["fields"]),
        "task_name": str(meta.get("task_name", "client")),
    }
    return str(meta["partition_id"]), body


class Primitives(Generic[R]):
    """Figure 4's queue and scheduler calls; subclasses say how a call runs."""

    def _run(self, call: Call) -> R:
        raise NotImplementedError

    # --- Training Queue ------------------------------------------------------------------

    def queue_put(
        self,
        partition_id: str,
        data: Mapping[str, np.ndarray],
        metadata: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    ) -> R:
        """Append samples to ``partition_id`` (created by its first put); their indexes."""
        meta: Any = dict(metadata) if isinstance(metadata, Mapping) else [dict(m) for m in metadata]
        body = {"data": _arrays(data), "metadata": meta}
        return self._run(Call("POST", f"{_QUEUE}/{partition_id}/put", msgpack=body, parse=_indexes))

    def get_meta(
        self, partition_id: str, fields: Sequence[str], batch_size: int, task_name: str
    ) -> R:
        """Up to ``batch_size`` samples ``task_name`` has not received: a ``BatchMeta``."""
        body = {"fields": list(fields), "batch_size": batch_size, "task_name": task_name}
        return self._run(Call("POST", f"{_QUEUE}/{partition_id}/get_meta", json=body))

    def get_data(self, meta: Mapping[str, Any]) -> R:
        """The tensors of the samples a ``get_meta`` answer names (field -> array)."""
        pid, body = _ref(meta)
        return self._run(
            Call(
                "POST",
                f"{_QUEUE}/{pid}/get_data",
                json=body,
                accept_msgpack=True,
                parse=_data,
            )
        )

    def put(self, meta: Mapping[str, Any], data: Mapping[str, np.ndarray]) -> R:
        """Write derived fields (row i of each array to ``meta["indexes"][i]``)."""
        pid, ref = _ref(meta)
        body = {"indexes": ref["indexes"], "data": _arrays(data)}
        return self._run(Call("POST", f"{_QUEUE}/{pid}/put_fields", msgpack=body))

    def clear(self, partition_id: str) -> R:
        """Release a consumed partition and its tensors."""
        return self._run(Call("DELETE", f"{_QUEUE}/{partition_id}"))

    def partitions(self) -> R:
        """The calling tenant's partitions (samples, fields, bytes, consumption)."""
        return self._run(Call("GET", _QUEUE))

    # --- Training Scheduler --------------------------------------------------------------

    def reserve(
        self,
        *,
        policy_key: str,
        domain: str,
        task_type: str,
        sample_count: int,
        producer_role: str,
        consumer_role: str,
        behavior_policy_version: int | None = None,
        max_policy_staleness: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> R:
        """Admit a job in ``reserved`` with the producer's lease (``lease_epoch``)."""
        body: dict[str, Any] = {
            "policy_key": policy_key,
            "domain": domain,
            "task_type": task_type,
            "sample_count": sample_count,
            "producer_role": producer_role,
            "consumer_role": consumer_role,
            "metadata": dict(metadata or {}),
        }
        if behavior_policy_version is not None:
            body["behavior_policy_version"] = behavior_policy_version
        if max_policy_staleness is not None:
            body["max_policy_staleness"] = max_policy_staleness
        return self._run(Call("POST", _JOBS, json=body))

    def mark(self, job_id: str, state: str, lease_epoch: int | None = None) -> R:
        """Move a job along a Table 4 edge that needs no lease grant (ends the lease)."""
        body = _epoch(lease_epoch, state=state)
        return self._run(Call("POST", f"{_JOBS}/{job_id}/mark", json=body))

    def hand_off(self, job_id: str, lease_epoch: int | None = None) -> R:
        """End production of a reserved RL job whose next stage is actor-forward."""
        return self._run(Call("POST", f"{_JOBS}/{job_id}/hand_off", json=_epoch(lease_epoch)))

    def lease_stage(self, state: str, leased_state: str, consumer_role: str, domain: str) -> R:
        """Lease the next job waiting in ``state`` into ``leased_state``, or ``None``."""
        body = {
            "state": state,
            "leased_state": leased_state,
            "consumer_role": consumer_role,
            "domain": domain,
        }
        return self._run(Call("POST", "/v1/scheduler/lease_stage", json=body, parse=_job_or_none))

    def lease(self, consumer_role: str, domains: Sequence[str], wait_s: float = 0.0) -> R:
        """Lease the best ready job of ``consumer_role`` (long-poll ``wait_s``), or ``None``."""
        body = {"consumer_role": consumer_role, "domains": list(domains), "wait_s": wait_s}
        return self._run(Call("POST", "/v1/scheduler/lease", json=body, parse=_job_or_none))

    def heartbeat(self, job_id: str, lease_epoch: int) -> R:
        """Extend the live lease ``lease_epoch`` by one TTL."""
        body = {"lease_epoch": lease_epoch}
        return self._run(Call("POST", f"{_JOBS}/{job_id}/heartbeat", json=body))

    def complete(
        self,
        job_id: str,
        lease_epoch: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> R:
        """Finish a leased job; ``metadata`` is merged into the job's."""
        body = _epoch(lease_epoch, metadata=dict(metadata or {}))
        return self._run(Call("POST", f"{_JOBS}/{job_id}/complete", json=body))

    def fail(self, job_id: str, reason: str, lease_epoch: int | None = None) -> R:
        """Move a nonterminal job to ``failed`` with ``reason``."""
        body = _epoch(lease_epoch, reason=reason)
        return self._run(Call("POST", f"{_JOBS}/{job_id}/fail", json=body))

    def drop(self, job_id: str, reason: str, lease_epoch: int | None = None) -> R:
        """Drop a stale RL job (``ready`` or ``leased``)."""
        body = _epoch(lease_epoch, reason=reason)
        return self._run(Call("POST", f"{_JOBS}/{job_id}/drop", json=body))

    def job(self, job_id: str) -> R:
        """One job's descriptor."""
        return self._run(Call("GET", f"{_JOBS}/{job_id}"))

    def jobs(self, state: str | None = None, limit: int = 1000) -> R:
        """The calling tenant's jobs, oldest first (``state``: only those in it)."""
        params: dict[str, Any] = {"limit": limit}
        if state is not None:
            params["state"] = state
        return self._run(Call("GET", _JOBS, params=params))
