"""A trainable tenant's success rate before and after its training.

A workload with ``success_eval`` is measured twice in its own environment session:
once before its first update (``initial``, at the version it starts from) and once
after its last (``final``). Each measurement is one pinned evaluation of
``success_eval.episodes`` episodes (before training: ``initial_episodes`` where set) on
the fixed seeds ``success_eval.seed + j`` (disjoint from the demonstration seeds, which
the spec checks), reported with its Wilson 95 % interval; the record (kind
``success_eval``) goes to the tenant's metrics log and the run summary reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from joynexus.algorithms.intervals import wilson_interval
from joynexus.services.protocols import InferenceModelServiceAPI
from joynexus.workflows.context import WorkflowTenant

__all__ = ["SUCCESS_EVAL", "Phase", "SuccessMeasure", "measure_success", "recorded_measure"]

#: The metrics-log kind of a measurement.
SUCCESS_EVAL = "success_eval"
Phase = Literal["initial", "final"]


@dataclass(frozen=True)
class SuccessMeasure:
    """One measurement of a tenant's success rate.

    Attributes:
        phase: ``initial`` (before training) or ``final`` (after).
        version: The one policy version every decision was served by.
        episodes / successes: Episodes run and how many succeeded.
        ci95: Wilson 95 % interval of the rate.
        first_seed: Episode ``j`` reset with ``first_seed + j``.
        mean_return: Mean episode return.
    """

    phase: Phase
    version: int
    episodes: int
    successes: int
    ci95: tuple[float, float]
    first_seed: int
    mean_return: float

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes

    def record(self) -> dict[str, Any]:
        """The metrics-log fields of this measurement."""
        return {
            "phase": self.phase,
            "policy_version": self.version,
            "episodes": self.episodes,
            "successes": self.successes,
            "success_rate": self.success_rate,
            "ci95": list(self.ci95),
            "first_seed": self.first_seed,
            "mean_return": self.mean_return,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SuccessMeasure:
        low, high = record["ci95"]
        return cls(
            phase=record["phase"],
            version=int(record["policy_version"]),
            episodes=int(record["episodes"]),
            successes=int(record["successes"]),
            ci95=(float(low), float(high)),
            first_seed=int(record["first_seed"]),
            mean_return=float(record["mean_return"]),
        )


def recorded_measure(records: list[dict[str, Any]], phase: Phase) -> SuccessMeasure | None:
    """The last recorded measurement of ``phase`` among metrics-log records."""
    found = [r for r in records if r.get("kind") == SUCCESS_EVAL and r.get("phase") == phase]
    return SuccessMeasure.from_record(found[-1]) if found else None


async def measure_success(
    inference: InferenceModelServiceAPI, tenant: WorkflowTenant, phase: Phase
) -> SuccessMeasure:
    """Measure ``tenant``'s success rate now, in its own session, and record it.

    Raises:
        ValueError: the tenant declares no ``success_eval`` or has no session.
        InvalidRequestError: the episodes do not end (see ``evaluate``).
    """
    ev = tenant.spec.success_eval
    if ev is None or tenant.session_id is None:
        raise ValueError(f"tenant {tenant.tenant_id!r} has no success_eval or no env session")
    episodes = ev.episodes
    if phase == "initial" and ev.initial_episodes is not None:
        episodes = ev.initial_episodes
    result = await inference.evaluate(
        tenant.tenant_id,
        tenant.session_id,
        episodes=episodes,
        deterministic=ev.deterministic,
        seed=ev.seed,
    )
    successes = result.successes
    measure = SuccessMeasure(
        phase=phase,
        version=int(result.version),
        episodes=int(result.episodes),
        successes=successes,
        ci95=wilson_interval(successes, int(result.episodes)),
        first_seed=ev.seed,
        mean_return=float(result.mean_return),
    )
    tenant.metrics.write(SUCCESS_EVAL, **measure.record())
    return measure
