"""Several rollout engines' Inference Queue metrics as one queue's.

The :class:`~joynexus.runtime.scaling.EnginePool` reports the sum of its engines'
counters through :func:`combine_metrics`, so a pool reads like one engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from joynexus.queues.inference_metrics import InferenceQueueMetrics, QueueWaitStats

__all__ = ["combine_metrics"]


def combine_metrics(parts: Sequence[InferenceQueueMetrics]) -> InferenceQueueMetrics:
    """Several engines' Inference Queue metrics as one queue's.

    Depth, counters and the batch-size histogram add up; ``max_batch_size`` and
    ``max_wait_s`` are the largest engine's; the mean batch size and fill ratio are
    weighted by batches and the mean queue wait by waits. The wait percentiles are the
    largest over the engines: an upper bound, since each engine keeps only its own
    recent waits. No engines: every number is zero.
    """
    histogram: dict[int, int] = {}
    for p in parts:
        for size, n in p.batch_size_histogram.items():
            histogram[size] = histogram.get(size, 0) + n
    batches = sum(p.batches for p in parts)
    waits = sum(p.queue_wait.count for p in parts)

    return InferenceQueueMetrics(
        max_batch_size=max((p.max_batch_size for p in parts), default=0),
        max_wait_s=max((p.max_wait_s for p in parts), default=0.0),
        queue_depth=sum(p.queue_depth for p in parts),
        requests=sum(p.requests for p in parts),
        completed=sum(p.completed for p in parts),
        errors=sum(p.errors for p in parts),
        validation_failures=sum(p.validation_failures for p in parts),
        rejections=sum(p.rejections for p in parts),
        timeouts=sum(p.timeouts for p in parts),
        cancellations=sum(p.cancellations for p in parts),
        batches=batches,
        retried_batches=sum(p.retried_batches for p in parts),
        samples=sum(p.samples for p in parts),
        batch_size_histogram=dict(sorted(histogram.items())),
        mean_batch_size=sum(p.samples for p in parts) / batches if batches else 0.0,
        fill_ratio=sum(p.fill_ratio * p.batches for p in parts) / batches if batches else 0.0,
        queue_wait=QueueWaitStats(
            count=waits,
            mean_s=sum(p.queue_wait.mean_s * p.queue_wait.count for p in parts) / waits
            if waits
            else 0.0,
            max_s=max((p.queue_wait.max_s for p in parts), default=0.0),
            p50_s=max((p.queue_wait.p50_s for p in parts), default=0.0),
            p95_s=max((p.queue_wait.p95_s for p in parts), default=0.0),
            p99_s=max((p.queue_wait.p99_s for p in parts), default=0.0),
        ),
    )
