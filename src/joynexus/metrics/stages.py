"""Where a ``predict`` call spends its time: per-stage seconds, cheap enough for every call.

A request over HTTP passes these stages (:data:`PREDICT_STAGES`):

* ``http_read`` — the route waits for the request body after its headers (the client's
  and the network's time: a client that writes the headers and the body separately
  makes the server wait between them; not the service's own work);
* ``http_decode`` — the route decodes the body it read (msgpack / JSON, pydantic);
* ``admission`` — the Inference Model Service resolves the tenant's slot, validates the
  observations against its schema once, normalizes them and enqueues;
* ``queue_wait`` — queued until its group batch is dispatched (the batcher's wait T and
  the previous batch still running);
* ``canonicalize`` — resize-with-pad, pixel layout (tensor ops or the backbone's
  processor), prompt ids, padding (per batch; before the lock);
* ``lock_wait`` — the dispatched batch waits for the backbone lock (training holds it);
* ``backbone`` — the one frozen forward (per batch);
* ``head`` — every tenant's action module decodes its rows (per batch; with the decode
  plan that prepares their inputs before the lock, and the copy of the answers to host
  memory after it);
* ``http_encode`` — the route encodes the answer.

Per-request stages count one event per request, per-batch stages one per batch, so a
scraper divides each stage's seconds by its own count. Unlike metric events (which build
a validated event object and go through the Metrics Service's delivery thread), a stage
is two additions under a lock: metering must not become the overhead it measures.
:class:`~joynexus.metrics.prometheus.StageCollector` exposes it at scrape time.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

__all__ = ["PER_BATCH_STAGES", "PREDICT_STAGES", "StageMeter"]

PREDICT_STAGES = (
    "http_read",
    "http_decode",
    "admission",
    "queue_wait",
    "lock_wait",
    "canonicalize",
    "backbone",
    "head",
    "http_encode",
)
#: Stages metered once per grouped batch (the others once per request).
PER_BATCH_STAGES = frozenset({"lock_wait", "canonicalize", "backbone", "head"})


class StageMeter:
    """Accumulated seconds and event counts per stage name (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def add(self, stage: str, seconds: float, count: int = 1) -> None:
        """Add ``seconds`` spent in ``stage`` over ``count`` events."""
        with self._lock:
            self._seconds[stage] = self._seconds.get(stage, 0.0) + seconds
            self._counts[stage] = self._counts.get(stage, 0) + count

    def add_many(self, seconds: Mapping[str, float]) -> None:
        """One event of each named stage (one batch's stages)."""
        with self._lock:
            for stage, value in seconds.items():
                self._seconds[stage] = self._seconds.get(stage, 0.0) + value
                self._counts[stage] = self._counts.get(stage, 0) + 1

    def snapshot(self) -> dict[str, tuple[float, int]]:
        """stage → (seconds, events) so far."""
        with self._lock:
            return {k: (v, self._counts[k]) for k, v in self._seconds.items()}
