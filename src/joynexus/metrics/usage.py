"""Per-tenant usage metering: the basis for the usage-based pricing of paper §6.

The shared services report how long their device work took; the meter attributes it to
tenants. A grouped batch (one backbone forward for several tenants) is split by each
tenant's share of its rows, so the attributed seconds of a batch always add up to the
measured total. Work that belongs to one tenant alone (its head's loss and optimizer
step, its simulator session) is attributed to it whole.

Services: ``training``, ``inference``, ``environment``. Counts: predict requests,
inference samples, samples trained, environment steps (sub-env steps).

Services in other processes (Ray actors) each keep a meter of their own; the host
moves their counts into its meter with :meth:`UsageMeter.drain` there and
:meth:`UsageMeter.merge` here, so the report covers work wherever it ran.

Thread-safe: services call it from worker threads. With a ``path`` the meter writes
its report there (atomically) at most every ``persist_interval_s`` and on
:meth:`UsageMeter.save`, so ``joynexus usage --run-dir`` can read it; ``resume=True``
starts from the totals a previous process left in that file.

The report types (:class:`~joynexus.api.UsageReport`, :class:`~joynexus.api.TenantUsage`)
live in the torch-free :mod:`joynexus.api`, shared with the server and the client.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from joynexus.api import SERVICES, ServiceName, TenantUsage, UsageReport
from joynexus.errors import InvalidRequestError
from joynexus.utils.clock import Clock, SystemClock

# Transitional: demo/phase.py still imports UsageReport from here; once it imports it
# from joynexus.api, drop "UsageReport" from this list.
__all__ = ["USAGE_FILE", "UsageMeter", "UsageReport", "split_by_rows"]

USAGE_FILE = "usage.json"


def _zero_seconds() -> dict[str, float]:
    return dict.fromkeys(SERVICES, 0.0)


def split_by_rows(rows: Mapping[str, int], seconds: float) -> dict[str, float]:
    """Attribute ``seconds`` to tenants by their share of ``rows``.

    The last tenant gets the remainder, so the parts add up to ``seconds`` exactly.

    Raises:
        InvalidRequestError: negative seconds or rows, or no rows at all.
    """
    if seconds < 0:
        raise InvalidRequestError(f"seconds must be ≥ 0, got {seconds}", field="seconds")
    if any(n < 0 for n in rows.values()):
        raise InvalidRequestError(f"row counts must be ≥ 0, got {dict(rows)}", field="rows")
    total = sum(rows.values())
    if total <= 0:
        raise InvalidRequestError("a shared batch needs at least one row", field="rows")
    out: dict[str, float] = {}
    items = [(t, n) for t, n in rows.items() if n > 0]
    given = 0.0
    for tid, n in items[:-1]:
        part = seconds * n / total
        out[tid] = part
        given += part
    out[items[-1][0]] = seconds - given
    return out


@dataclass
class _Tenant:
    device: dict[str, float] = field(default_factory=_zero_seconds)
    requests: int = 0
    inference_samples: int = 0
    samples_trained: int = 0
    env_steps: int = 0


class UsageMeter:
    """Thread-safe per-tenant usage counters (see module docstring).

    Args:
        path: Where to persist the report (e.g. ``<run_dir>/usage.json``); None = never.
        persist_interval_s: Least time between automatic writes.
        clock: Time source for the write interval and the report's timestamps.
        resume: Start from the totals already in ``path`` (a restarted server).
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        persist_interval_s: float = 10.0,
        clock: Clock | None = None,
        resume: bool = False,
    ) -> None:
        self.path = None if path is None else Path(path)
        self.persist_interval_s = persist_interval_s
        self.clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._tenants: dict[str, _Tenant] = {}
        self._service = _zero_seconds()
        self._started_at = self.clock.wall()
        self._last_save = self.clock.now()
        if resume and self.path is not None and self.path.is_file():
            self._restore(UsageReport.load(self.path))

    def _restore(self, report: UsageReport) -> None:
        self._started_at = report.started_at
        self._add(report)

    def merge(self, report: UsageReport) -> None:
        """Add another meter's counts (a remote service's :meth:`drain`) to this one."""
        with self._lock:
            self._add(report)
        self._maybe_persist()

    def drain(self) -> UsageReport:
        """The counts recorded since the last drain, and reset them (atomically): what a
        remote service's meter hands to the host's :meth:`merge`, each count once."""
        with self._lock:
            report = self._snapshot_locked()
            self._tenants = {}
            self._service = _zero_seconds()
        return report

    def _add(self, report: UsageReport) -> None:
        for service, seconds in report.service_seconds.items():
            self._service[service] = self._service.get(service, 0.0) + seconds
        for tid, u in report.tenants.items():
            t = self._tenant(tid)
            for service, seconds in u.device_seconds.items():
                t.device[service] = t.device.get(service, 0.0) + seconds
            t.requests += u.requests
            t.inference_samples += u.inference_samples
            t.samples_trained += u.samples_trained
            t.env_steps += u.env_steps

    def _tenant(self, tenant_id: str) -> _Tenant:
        t = self._tenants.get(tenant_id)
        if t is None:
            t = self._tenants[tenant_id] = _Tenant()
        return t

    # --- recording -----------------------------------------------------------------------

    def record_shared(self, service: ServiceName, rows: Mapping[str, int], seconds: float) -> None:
        """Attribute one shared (grouped) execution of ``seconds`` by row share.

        Raises:
            InvalidRequestError: an unknown service, negative values, or no rows.
        """
        self._add_shared(service, rows, seconds)
        self._maybe_persist()

    def _add_shared(self, service: ServiceName, rows: Mapping[str, int], seconds: float) -> None:
        _check_service(service)
        parts = split_by_rows(rows, seconds)
        with self._lock:
            self._service[service] += seconds
            for tid, part in parts.items():
                self._tenant(tid).device[service] += part

    def record_device(self, service: ServiceName, tenant_id: str, seconds: float) -> None:
        """Attribute ``seconds`` of ``service`` to one tenant."""
        self.record_shared(service, {tenant_id: 1}, seconds)

    def record_inference(self, rows: Mapping[str, int], seconds: float) -> None:
        """One grouped inference batch: ``rows`` samples per tenant over ``seconds``."""
        self._add_shared("inference", rows, seconds)
        with self._lock:
            for tid, n in rows.items():
                self._tenant(tid).inference_samples += n
        self._maybe_persist()

    def record_request(self, tenant_id: str, count: int = 1) -> None:
        """``count`` predict requests of the tenant were accepted."""
        with self._lock:
            self._tenant(tenant_id).requests += count
        self._maybe_persist()

    def record_training(
        self,
        rows: Mapping[str, int],
        shared_seconds: float,
        own_seconds: Mapping[str, float],
        *,
        count_samples: bool = True,
    ) -> None:
        """One (possibly grouped) training step.

        Args:
            rows: Samples per tenant in the step.
            shared_seconds: The shared backbone forward, split by row share.
            own_seconds: Each tenant's own head / loss / optimizer time.
            count_samples: Count ``rows`` as samples trained (False for forward-only
                work such as the actor-forward stage).
        """
        parts = split_by_rows(rows, shared_seconds)
        if any(s < 0 for s in own_seconds.values()):
            raise InvalidRequestError(f"own seconds must be ≥ 0, got {dict(own_seconds)}")
        with self._lock:
            self._service["training"] += shared_seconds + sum(own_seconds.values())
            for tid, part in parts.items():
                self._tenant(tid).device["training"] += part
            for tid, s in own_seconds.items():
                self._tenant(tid).device["training"] += s
            if count_samples:
                for tid, n in rows.items():
                    self._tenant(tid).samples_trained += n
        self._maybe_persist()

    def record_env(self, tenant_id: str, steps: int, seconds: float) -> None:
        """A simulator call of the tenant's session: ``steps`` sub-env steps (0 for a
        reset) over ``seconds``."""
        self._add_shared("environment", {tenant_id: 1}, seconds)
        with self._lock:
            self._tenant(tenant_id).env_steps += steps
        self._maybe_persist()

    # --- reading -------------------------------------------------------------------------

    def snapshot(self) -> UsageReport:
        with self._lock:
            return self._snapshot_locked()

    def _snapshot_locked(self) -> UsageReport:
        tenants = {
            tid: TenantUsage(
                tenant_id=tid,
                device_seconds=dict(t.device),
                requests=t.requests,
                inference_samples=t.inference_samples,
                samples_trained=t.samples_trained,
                env_steps=t.env_steps,
            )
            for tid, t in sorted(self._tenants.items())
        }
        return UsageReport(
            started_at=self._started_at,
            generated_at=self.clock.wall(),
            tenants=tenants,
            service_seconds=dict(self._service),
        )

    def report(self) -> UsageReport:
        """The usage as users see it: persisted first, then returned.

        Whatever a caller was shown is on disk, so a server restarted on the same file
        (``resume=True``) never reports less: usage is monotone across restarts.
        """
        if self.path is None:
            return self.snapshot()
        try:
            return self._write(self.path)  # the very snapshot that is on disk
        except OSError:  # the report still answers (from memory); the next one retries
            return self.snapshot()

    def tenant(self, tenant_id: str) -> TenantUsage:
        """One tenant's usage (zeros for a tenant never seen)."""
        return self.snapshot().tenants.get(tenant_id, TenantUsage(tenant_id=tenant_id))

    # --- persistence ---------------------------------------------------------------------

    def save(self, path: str | Path | None = None) -> Path:
        """Write the report atomically to ``path`` (default: the meter's path).

        Raises:
            InvalidRequestError: no path given and the meter has none.
        """
        target = Path(path) if path is not None else self.path
        if target is None:
            raise InvalidRequestError("UsageMeter.save needs a path (the meter was built without)")
        self._write(target)
        return target

    def _write(self, target: Path) -> UsageReport:
        """Snapshot and write under one lock (two concurrent saves can never leave the
        older snapshot on disk); returns what was written."""
        with self._save_lock:
            report = self.snapshot()
            text = json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".usage-", suffix=".json", dir=target.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            self._last_save = self.clock.now()
        return report

    def _maybe_persist(self) -> None:
        if self.path is None or self.clock.now() - self._last_save < self.persist_interval_s:
            return
        # Metering must not fail the work it meters; the next record retries.
        with contextlib.suppress(OSError):
            self.save()


def _check_service(service: str) -> None:
    if service not in SERVICES:
        raise InvalidRequestError(
            f"unknown service {service!r}; allowed {list(SERVICES)}", field="service"
        )
