"""Decoded video frames kept per episode, so that SFT sampling decodes each once.

A training sample of a LeRobot video dataset asks for a few frames of one episode.
Decoding them on demand opens the file, seeks to a keyframe and decodes a few frames,
for every sample of every job: in the demo's profile that was a third of the host's
CPU time, on the same core as the device. An SFT tenant samples the same episodes
over and over, so :class:`FrameCache` decodes an episode's span once and keeps the
frames (least recently used out first) within a byte budget; a sample then only picks
its frames (:func:`joynexus.data.video.pick_frames`, the same choice as decoding).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

__all__ = ["DEFAULT_FRAME_CACHE_MB", "FrameCache"]

#: Default budget of a dataset's decoded frames (a 64 px episode of 50 frames is 0.6 MB;
#: 128 px LIBERO's of 150 frames, 7.4 MB).
DEFAULT_FRAME_CACHE_MB = 256.0

Span = tuple[np.ndarray, np.ndarray]


class FrameCache:
    """Decoded spans (frame times, frames) by key, least recently used out first.

    Args:
        budget_bytes: Most bytes of frames kept; a span larger than this is decoded
            and returned but not kept.

    Thread-safe: SFT batches are built in worker threads. Two threads missing the same
    span both decode it (the decode runs outside the lock); one copy is kept.
    """

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._spans: OrderedDict[Hashable, Span] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._spans)

    def get(self, key: Hashable, decode: Callable[[], Span]) -> Span:
        """The span kept under ``key``, or ``decode()``'s, kept if it fits the budget."""
        with self._lock:
            span = self._spans.get(key)
            if span is not None:
                self._spans.move_to_end(key)
                self.hits += 1
                return span
            self.misses += 1
        span = decode()
        size = span[0].nbytes + span[1].nbytes
        if size > self.budget_bytes:
            return span
        with self._lock:
            if key not in self._spans:
                self._spans[key] = span
                self._bytes += size
                while self._bytes > self.budget_bytes:
                    _, (times, frames) = self._spans.popitem(last=False)
                    self._bytes -= times.nbytes + frames.nbytes
        return span
