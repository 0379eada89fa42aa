"""Per-tenant quotas: request rate and ``get_data`` bytes (token buckets) and resource
counts.

Every refusal is a :class:`~joynexus.errors.QuotaExceededError` (HTTP 429) whose
``details`` carry ``reason`` (one of :data:`QUOTA_REASONS`), ``limit`` and, for the
rate limits, ``retry_after_s``. Time comes from the injected clock, so tests drive the
bucket with a ``FakeClock`` instead of sleeping.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from joynexus.errors import QuotaExceededError
from joynexus.server.config import TenantQuotas
from joynexus.utils.clock import Clock

__all__ = ["QUOTA_REASONS", "QuotaManager"]

#: Machine-readable reasons of a 429 from a tenant quota.
QUOTA_REASONS = (
    "rate_limit",
    "sessions",
    "inflight_jobs",
    "queue_bytes",
    "partitions",
    "pending_futures",
    "read_bytes",
    "disk_bytes",
)


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class QuotaManager:
    """Checks tenant requests and resource counts against their quotas.

    Args:
        clock: Time source of the token buckets.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._read_buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take_request(self, tenant_id: str, quotas: TenantQuotas) -> None:
        """Spend one request token of ``tenant_id``.

        Raises:
            QuotaExceededError: reason ``rate_limit``, with ``retry_after_s``.
        """
        now = self._clock.now()
        with self._lock:
            bucket = self._buckets.get(tenant_id)
            if bucket is None:
                bucket = self._buckets[tenant_id] = _Bucket(float(quotas.burst), now)
            elapsed = max(0.0, now - bucket.updated)
            bucket.tokens = min(
                float(quotas.burst), bucket.tokens + elapsed * quotas.requests_per_s
            )
            bucket.updated = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return
            retry = (1.0 - bucket.tokens) / quotas.requests_per_s
        raise QuotaExceededError(
            f"tenant {tenant_id!r} exceeded its request rate of {quotas.requests_per_s:g}/s "
            f"(burst {quotas.burst}); retry in {retry:.3f} s",
            reason="rate_limit",
            limit=quotas.requests_per_s,
            retry_after_s=retry,
        )

    def take_read_bytes(self, tenant_id: str, nbytes: int, quotas: TenantQuotas) -> None:
        """Spend ``nbytes`` of the tenant's ``get_data`` byte budget (a token bucket of
        ``read_burst_bytes`` refilled at ``read_bytes_per_s``).

        Raises:
            QuotaExceededError: reason ``read_bytes``, with ``retry_after_s``: when the
                bytes will be there (the read itself must fit ``read_burst_bytes``).
        """
        rate, burst = quotas.read_bytes_per_s, float(quotas.read_burst_bytes)
        now = self._clock.now()
        with self._lock:
            bucket = self._read_buckets.get(tenant_id)
            if bucket is None:
                bucket = self._read_buckets[tenant_id] = _Bucket(burst, now)
            bucket.tokens = min(burst, bucket.tokens + max(0.0, now - bucket.updated) * rate)
            bucket.updated = now
            if bucket.tokens >= nbytes:
                bucket.tokens -= nbytes
                return
            retry = (nbytes - bucket.tokens) / rate
        raise QuotaExceededError(
            f"tenant {tenant_id!r} read {nbytes} bytes with get_data beyond its budget of "
            f"{rate:g} bytes/s (burst {quotas.read_burst_bytes}); retry in {retry:.3f} s",
            reason="read_bytes",
            limit=rate,
            retry_after_s=retry,
            requested=nbytes,
        )

    def refund_read_bytes(self, tenant_id: str, nbytes: int, quotas: TenantQuotas) -> None:
        """Give back bytes a read charged and never answered (it failed)."""
        with self._lock:
            bucket = self._read_buckets.get(tenant_id)
            if bucket is not None:
                bucket.tokens = min(float(quotas.read_burst_bytes), bucket.tokens + nbytes)

    @staticmethod
    def check_count(
        tenant_id: str, reason: str, current: int, adding: int, limit: int, what: str
    ) -> None:
        """Refuse when ``current + adding`` would exceed ``limit``.

        Raises:
            QuotaExceededError: with ``reason``, ``limit`` and ``current``.
        """
        if current + adding > limit:
            raise QuotaExceededError(
                f"tenant {tenant_id!r} holds {current} {what}; adding {adding} would exceed "
                f"its quota of {limit}",
                reason=reason,
                limit=limit,
                current=current,
                requested=adding,
            )
