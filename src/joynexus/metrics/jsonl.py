"""Per-tenant metrics JSONL files in each tenant's output directory.

The paper keeps experiment artifacts in the tenant's output directory so they outlive
the runtime (§4.1.3); this sink appends every event that carries a ``tenant_id`` to
``<tenant dir>/metrics.jsonl``, one :class:`~joynexus.metrics.events.MetricEvent` JSON
object per line. Service-wide events go to ``service_path`` when one is given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import IO

from joynexus.metrics.events import MetricCategory, MetricEvent

__all__ = ["METRICS_FILE", "TenantJsonlSink"]

METRICS_FILE = "metrics.jsonl"


class TenantJsonlSink:
    """Appends events to per-tenant JSONL files.

    Args:
        tenant_dir: The tenant's output directory: a callable ``tenant_id -> Path`` or
            a root under which ``<root>/<tenant_id>/`` is used.
        service_path: File for events without a tenant (default: not written).
        categories: Categories written (default: all).
    """

    def __init__(
        self,
        tenant_dir: Callable[[str], Path] | Path,
        *,
        service_path: Path | None = None,
        categories: Collection[MetricCategory] | None = None,
    ) -> None:
        if isinstance(tenant_dir, Path):
            root = tenant_dir
            self._dir_of: Callable[[str], Path] = lambda tid: root / tid
        else:
            self._dir_of = tenant_dir
        self._service_path = service_path
        self._categories = None if categories is None else frozenset(categories)
        self._files: dict[str | None, IO[str]] = {}
        self._lock = threading.Lock()

    def path_of(self, tenant_id: str) -> Path:
        return self._dir_of(tenant_id) / METRICS_FILE

    def _file(self, tenant_id: str | None) -> IO[str] | None:
        f = self._files.get(tenant_id)
        if f is None:
            path = self._service_path if tenant_id is None else self.path_of(tenant_id)
            if path is None:
                return None
            path.parent.mkdir(parents=True, exist_ok=True)
            f = self._files[tenant_id] = path.open("a", encoding="utf-8")
        return f

    def handle(self, events: Sequence[MetricEvent]) -> None:
        touched: set[str | None] = set()
        with self._lock:
            for e in events:
                if self._categories is not None and e.category not in self._categories:
                    continue
                f = self._file(e.tenant_id)
                if f is None:
                    continue
                f.write(e.model_dump_json() + "\n")
                touched.add(e.tenant_id)
            for tid in touched:
                self._files[tid].flush()

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()
