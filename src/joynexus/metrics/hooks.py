"""What the runtime services report, in one place (no-op without a sink).

The Training, Inference and Environment services each hold one :class:`Instruments`
built from their optional ``metrics`` / ``usage`` constructor keywords, and call it at
the points where device work finishes. Keeping the event names and the attribution
here keeps the services' own code to a line per call site.

Event names (category):

* ``inference.batch_latency_s`` (system; histogram), ``inference.batch_size`` and
  ``inference.batch_tenants`` (system; histograms) — one per grouped inference batch.
* ``inference.weight_sync_s`` (system, per tenant) — a ``load_weights`` publication.
* ``training.step_latency_s`` (system), ``training.step_rows`` (system) — one per
  (grouped) optimizer step.
* ``train.loss``, ``train.grad_norm``, ``train.policy_version`` (learning, per tenant,
  ``step`` = the policy version after the step).
* ``rollout.mean_return``, ``rollout.success_rate``, ``eval.mean_return``,
  ``eval.success_rate`` (learning, per tenant).
* ``env.step_latency_s`` (system, per tenant), with ``env.step_wait_s`` just before it
  where the simulator's run-queue wait was measured (ready, its core busy elsewhere).

Predict-path stage times (admission, queue wait, lock wait, canonicalize, backbone,
head) go to the Metrics Service's :class:`~joynexus.metrics.stages.StageMeter`, not the
event bus: they are metered on every call.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from joynexus.metrics.events import MetricCategory, MetricsService
from joynexus.metrics.usage import UsageMeter

__all__ = ["Instruments"]

log = logging.getLogger(__name__)


class Instruments:
    """Reports of one service to an optional Metrics Service and usage meter.

    Every method is safe to call from worker threads and never raises: metering must
    not fail the work it meters (a failure is logged).
    """

    def __init__(self, metrics: MetricsService | None, usage: UsageMeter | None) -> None:
        self.metrics = metrics
        self.usage = usage

    @property
    def enabled(self) -> bool:
        return self.metrics is not None or self.usage is not None

    def _emit(
        self,
        category: MetricCategory,
        name: str,
        value: float,
        tenant_id: str | None = None,
        step: int | None = None,
    ) -> None:
        if self.metrics is not None:
            self.metrics.emit_value(category, name, value, tenant_id=tenant_id, step=step)

    # --- inference ------------------------------------------------------------------------

    def request(self, tenant_id: str) -> None:
        if self.usage is not None:
            self.usage.record_request(tenant_id)

    def inference_batch(self, rows: Mapping[str, int], seconds: float) -> None:
        """One grouped backbone forward + heads over ``rows`` samples per tenant."""
        try:
            if self.usage is not None and rows:
                self.usage.record_inference(rows, seconds)
            self._emit("system", "inference.batch_latency_s", seconds)
            self._emit("system", "inference.batch_size", float(sum(rows.values())))
            self._emit("system", "inference.batch_tenants", float(len(rows)))
        except Exception:
            log.exception("metering an inference batch failed")

    def stage(self, stage: str, seconds: float, count: int = 1) -> None:
        """Predict-path stage time (:mod:`joynexus.metrics.stages`)."""
        if self.metrics is not None:
            self.metrics.stages.add(stage, seconds, count)

    def batch_stages(self, seconds: Mapping[str, float]) -> None:
        """One grouped batch's per-batch stage times."""
        if self.metrics is not None:
            self.metrics.stages.add_many(seconds)

    def weight_sync(self, tenant_id: str, seconds: float, version: int) -> None:
        self._emit("system", "inference.weight_sync_s", seconds, tenant_id, version)

    def rollout(self, tenant_id: str, version: int, mean_return: float, success: float) -> None:
        self._emit("learning", "rollout.mean_return", mean_return, tenant_id, version)
        self._emit("learning", "rollout.success_rate", success, tenant_id, version)

    def evaluation(self, tenant_id: str, version: int, mean_return: float, success: float) -> None:
        self._emit("learning", "eval.mean_return", mean_return, tenant_id, version)
        self._emit("learning", "eval.success_rate", success, tenant_id, version)

    # --- training -------------------------------------------------------------------------

    def training_step(
        self,
        rows: Mapping[str, int],
        shared_seconds: float,
        own_seconds: Mapping[str, float],
        *,
        count_samples: bool = True,
    ) -> None:
        """A (grouped) training step: shared forward split by rows, own time whole."""
        try:
            if self.usage is not None and rows:
                self.usage.record_training(
                    rows, shared_seconds, own_seconds, count_samples=count_samples
                )
            total = shared_seconds + sum(own_seconds.values())
            self._emit("system", "training.step_latency_s", total)
            self._emit("system", "training.step_rows", float(sum(rows.values())))
        except Exception:
            log.exception("metering a training step failed")

    def learning_step(
        self, tenant_id: str, version: int, loss: float, grad_norm: float | None
    ) -> None:
        self._emit("learning", "train.loss", loss, tenant_id, version)
        if grad_norm is not None:
            self._emit("learning", "train.grad_norm", grad_norm, tenant_id, version)
        self._emit("learning", "train.policy_version", float(version), tenant_id, version)

    # --- environment ----------------------------------------------------------------------

    def env_call(
        self, tenant_id: str, steps: int, seconds: float, *, wait_s: float | None = None
    ) -> None:
        """A reset (``steps=0``) or step of one of the tenant's sessions; ``wait_s``: the
        simulator's run-queue wait inside it (None: not measured)."""
        try:
            if self.usage is not None:
                self.usage.record_env(tenant_id, steps, seconds)
            if steps:
                if wait_s is not None:
                    # Before the latency event: a sink pairs it with the call that follows.
                    self._emit("system", "env.step_wait_s", wait_s, tenant_id)
                self._emit("system", "env.step_latency_s", seconds, tenant_id)
        except Exception:
            log.exception("metering an environment call failed")
