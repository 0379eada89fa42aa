"""The optional autoscaler of the engine pool (paper §4.1.3, "Elastic scaling").

:class:`Autoscaler` (off unless its policy enables it) scales the
:class:`~joynexus.runtime.scaling.EnginePool` out when the outstanding calls per engine
exceed a threshold and in when they fall below another, at most once per cooldown.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, Field

from joynexus.runtime.scaling import EnginePool
from joynexus.utils.clock import Clock

__all__ = ["AutoscalePolicy", "Autoscaler"]

log = logging.getLogger(__name__)


class AutoscalePolicy(BaseModel):
    """When the optional autoscaler changes the pool size (off by default)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    min_engines: int = Field(default=1, ge=1)
    max_engines: int = Field(default=4, ge=1)
    scale_out_above: float = Field(default=4.0, gt=0, description="outstanding calls / engine")
    scale_in_below: float = Field(default=0.5, ge=0, description="outstanding calls / engine")
    interval_s: float = Field(default=5.0, gt=0)
    cooldown_s: float = Field(default=30.0, ge=0)


class Autoscaler:
    """Inference-pressure-driven pool sizing (see :class:`AutoscalePolicy`)."""

    def __init__(self, pool: EnginePool, policy: AutoscalePolicy, clock: Clock) -> None:
        self.pool = pool
        self.policy = policy
        self.clock = clock
        self._last_change: float | None = None
        self.decisions: list[tuple[float, int, int]] = []  # (time, from, to)

    def target(self) -> int:
        """The size the policy wants now (the current size when nothing should change)."""
        size = self.pool.size
        pressure = self.pool.in_flight / max(size, 1)
        if pressure > self.policy.scale_out_above and size < self.policy.max_engines:
            return size + 1
        if pressure < self.policy.scale_in_below and size > self.policy.min_engines:
            return size - 1
        return size

    async def step(self) -> int:
        """Apply one decision (respecting the cooldown); returns the pool size."""
        now = self.clock.now()
        if self._last_change is not None and now - self._last_change < self.policy.cooldown_s:
            return self.pool.size
        want = self.target()
        if want != self.pool.size:
            before = self.pool.size
            try:
                await self.pool.scale_to(want)
            except Exception as error:  # rolled back by the pool; try again next interval
                log.warning("autoscaler: scale %s → %s failed: %s", before, want, error)
                return self.pool.size
            self._last_change = now
            self.decisions.append((now, before, want))
        return self.pool.size

    async def run(self) -> None:
        if not self.policy.enabled:
            return
        while True:
            await self.clock.sleep(self.policy.interval_s)
            await self.step()
