"""Counters of the Inference Queue and the snapshot it reports to monitoring."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

# Percentiles are computed over this many most recent queue waits; mean and max cover
# every request since start.
WAIT_WINDOW = 4096


class QueueWaitStats(BaseModel):
    """Seconds requests spent queued before their batch was dispatched."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int
    mean_s: float
    max_s: float
    p50_s: float = Field(description=f"over the last {WAIT_WINDOW} dispatched requests")
    p95_s: float
    p99_s: float


class InferenceQueueMetrics(BaseModel):
    """A point-in-time snapshot of the Inference Queue's batching behaviour."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch_size: int = Field(description="B, in samples")
    max_wait_s: float = Field(description="T")
    queue_depth: int = Field(description="requests queued now")
    requests: int = Field(description="requests accepted into the queue")
    completed: int = Field(description="requests resolved with a result")
    errors: int = Field(description="requests failed by the batch function or a wrong result")
    validation_failures: int
    rejections: int = Field(description="enqueue calls refused because the queue was full")
    timeouts: int = Field(description="requests whose deadline passed while queued")
    cancellations: int = Field(description="requests cancelled by their caller while queued")
    batches: int = Field(description="batch-function calls for formed batches (not retries)")
    retried_batches: int = Field(description="batches that raised and were retried one by one")
    samples: int = Field(description="samples dispatched in formed batches")
    batch_size_histogram: dict[int, int] = Field(
        description="samples per dispatched batch -> number of batches"
    )
    mean_batch_size: float
    fill_ratio: float = Field(description="mean over batches of min(samples, B) / B")
    queue_wait: QueueWaitStats


@dataclass(slots=True)
class _Counters:
    requests: int = 0
    completed: int = 0
    errors: int = 0
    validation_failures: int = 0
    rejections: int = 0
    timeouts: int = 0
    cancellations: int = 0
    batches: int = 0
    retried_batches: int = 0
    samples: int = 0
    fill_sum: float = 0.0
    histogram: dict[int, int] = field(default_factory=dict)
    wait_count: int = 0
    wait_sum: float = 0.0
    wait_max: float = 0.0
    waits: deque[float] = field(default_factory=lambda: deque(maxlen=WAIT_WINDOW))

    def record_batch(self, samples: int, max_batch_size: int) -> None:
        self.batches += 1
        self.samples += samples
        self.fill_sum += min(samples, max_batch_size) / max_batch_size
        self.histogram[samples] = self.histogram.get(samples, 0) + 1

    def record_waits(self, waits: list[float]) -> None:
        self.wait_count += len(waits)
        self.wait_sum += sum(waits)
        self.wait_max = max(self.wait_max, *waits) if waits else self.wait_max
        self.waits.extend(waits)

    def snapshot(
        self, *, max_batch_size: int, max_wait_s: float, queue_depth: int
    ) -> InferenceQueueMetrics:
        recent = sorted(self.waits)

        def pct(q: float) -> float:
            if not recent:
                return 0.0
            return recent[min(len(recent) - 1, int(q * len(recent)))]

        return InferenceQueueMetrics(
            max_batch_size=max_batch_size,
            max_wait_s=max_wait_s,
            queue_depth=queue_depth,
            requests=self.requests,
            completed=self.completed,
            errors=self.errors,
            validation_failures=self.validation_failures,
            rejections=self.rejections,
            timeouts=self.timeouts,
            cancellations=self.cancellations,
            batches=self.batches,
            retried_batches=self.retried_batches,
            samples=self.samples,
            batch_size_histogram=dict(sorted(self.histogram.items())),
            mean_batch_size=self.samples / self.batches if self.batches else 0.0,
            fill_ratio=self.fill_sum / self.batches if self.batches else 0.0,
            queue_wait=QueueWaitStats(
                count=self.wait_count,
                mean_s=self.wait_sum / self.wait_count if self.wait_count else 0.0,
                max_s=self.wait_max,
                p50_s=pct(0.50),
                p95_s=pct(0.95),
                p99_s=pct(0.99),
            ),
        )
