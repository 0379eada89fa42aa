"""This process's memory, measured while a bench runs (not computed from parameter counts).

:class:`PeakRss` samples the resident set size (psutil) from a thread and keeps the
peak; on a GPU it also reads torch's allocator peak. The model benches report the RSS
before and after loading the backbone and the peak over their forwards.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from joynexus.bench.server_procs import psutil_module

__all__ = ["PeakRss", "rss_mb"]

MB = 2**20


def rss_mb() -> float:
    """This process's resident set size now, in MiB."""
    return float(psutil_module().Process().memory_info().rss) / MB


class PeakRss:
    """Peak RSS (MiB) of this process while the ``with`` block runs, sampled every
    ``period_s`` (and at entry and exit); ``cuda_peak_mb`` is torch's allocator peak on
    ``device`` when it is a GPU."""

    def __init__(self, device: torch.device | None = None, period_s: float = 0.05) -> None:
        self.device = device
        self.period_s = period_s
        self.peak_mb = 0.0
        self.cuda_peak_mb: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak_mb = max(self.peak_mb, rss_mb())

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def __enter__(self) -> PeakRss:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        if self.device is not None and self.device.type == "cuda":
            self.cuda_peak_mb = torch.cuda.max_memory_allocated(self.device) / MB

    def as_dict(self) -> dict[str, Any]:
        return {"rss_peak_mb": self.peak_mb, "cuda_peak_allocated_mb": self.cuda_peak_mb}
