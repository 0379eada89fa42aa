"""The Inference Queue's queued requests: an entry per request and, per group key, the
tenants' FIFO queues with the counts batch formation reads (samples queued, each
tenant's share, when each tenant was last served). The batching policy that uses them
is :class:`~joynexus.queues.inference.InferenceQueue`'s (see its module docstring).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol

from joynexus.queues.inference_metrics import _Counters
from joynexus.queues.request import InferenceRequest


class _Owner(Protocol):
    """What an entry needs of its queue (the InferenceQueue; a protocol, so this
    module does not import the queue back)."""

    _stats: _Counters

    def _discard(self, entry: _Entry) -> None: ...


_QUEUED, _DISPATCHED, _DONE = 0, 1, 2


class _Entry:
    __slots__ = ("expires_at", "future", "group", "n", "owner", "request", "seq", "state", "t0")

    def __init__(
        self,
        owner: _Owner,
        request: InferenceRequest,
        future: asyncio.Future[Any],
        group: _Group,
        seq: int,
        t0: float,
        expires_at: float | None,
    ) -> None:
        self.owner = owner
        self.request = request
        self.future = future
        self.group = group
        self.seq = seq
        self.t0 = t0
        self.expires_at = expires_at
        self.n = request.num_samples
        self.state = _QUEUED

    def on_done(self, future: asyncio.Future[Any]) -> None:
        # Runs for every completion; only a cancellation while queued has work to do.
        if self.state == _QUEUED and future.cancelled():
            self.owner._discard(self)
            self.owner._stats.cancellations += 1

    def __lt__(self, other: _Entry) -> bool:  # deadline heap tiebreak
        return self.seq < other.seq


class _Group:
    __slots__ = ("batches", "entries", "key", "samples", "served", "tenant_samples", "tenants")

    def __init__(self, key: str) -> None:
        self.key = key
        self.entries: deque[_Entry] = deque()
        self.samples = 0  # samples of live queued entries
        # Per-tenant FIFO queues (same entries; finished ones dropped lazily) and the
        # samples each tenant has queued (live entries only).
        self.tenants: dict[str, deque[_Entry]] = {}
        self.tenant_samples: dict[str, int] = {}
        # The number of the group's last batch each tenant had a share in: the
        # round-robin turns of a batch start with the tenant served longest ago.
        self.served: dict[str, int] = {}
        self.batches = 0

    def add(self, entry: _Entry) -> None:
        self.entries.append(entry)
        tenant = entry.request.tenant_id
        own = self.tenants.get(tenant)
        if own is None:
            own = self.tenants[tenant] = deque()
        own.append(entry)
        self.samples += entry.n
        self.tenant_samples[tenant] = self.tenant_samples.get(tenant, 0) + entry.n

    def take(self, entry: _Entry) -> None:
        """Count a live queued entry out (dispatched, cancelled, expired or failed)."""
        self.samples -= entry.n
        tenant = entry.request.tenant_id
        left = self.tenant_samples.get(tenant, 0) - entry.n
        if left > 0:
            self.tenant_samples[tenant] = left
        else:
            self.tenant_samples.pop(tenant, None)

    def full(self, b: int, c: int) -> bool:
        """A batch formed now could not grow by waiting for the tenants queued: it
        holds ≥ B samples, or every tenant has at least its share C queued."""
        if self.samples >= b:
            return True
        shares = self.tenant_samples.values()
        return bool(shares) and all(n >= c for n in shares)

    def turns(self) -> deque[str]:
        """The tenants with queued work, served longest ago first (then the older
        request first)."""
        live: list[tuple[int, int, str]] = []
        for tenant in list(self.tenants):
            e = self.tenant_head(tenant)
            if e is not None:
                live.append((self.served.get(tenant, 0), e.seq, tenant))
        live.sort()
        return deque(t for _, _, t in live)

    def tenant_head(self, tenant: str) -> _Entry | None:
        """The tenant's oldest live queued entry; forgets a tenant with none."""
        own = self.tenants.get(tenant)
        while own:
            e = own[0]
            if e.state == _QUEUED and not e.future.done():
                return e
            own.popleft()
        self.tenants.pop(tenant, None)
        return None

    def head(self) -> _Entry | None:
        """Oldest live queued entry, dropping finished ones from the front."""
        entries = self.entries
        while entries:
            e = entries[0]
            if e.state == _QUEUED and not e.future.done():
                return e
            entries.popleft()
            e.owner._discard(e)
        return None
