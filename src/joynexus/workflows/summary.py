"""The run summary ``joynexus run --json`` writes: one entry per tenant.

Every tenant has ``task``, ``jobs_completed``, ``jobs_dropped``, ``jobs_failed`` and
``final_version``; SFT tenants add ``sft_heldout_error_initial`` / ``_final`` (mean
absolute action error on held-out frames, normalised units), RL tenants
``rl_return_initial`` / ``_final`` (mean episode return of the first and last rollouts)
and evaluation workloads ``eval_success_rate`` (mean over the targets of the last run)
plus every run with the one version it saw and its Wilson 95 % interval.

A trainable tenant with ``success_eval`` adds ``success_rate_initial`` /
``success_rate_final`` (episodes succeeded ÷ ``eval_episodes``, on the fixed seeds
``eval_first_seed + j``), ``success_rate_ci95`` (the final rate's Wilson 95 % interval)
and ``success_rate_ci95_initial``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EvalRunSummary", "RunSummary", "TenantProgress", "TenantSummary"]


def _rounded(ci: tuple[float, float] | None) -> list[float] | None:
    return None if ci is None else [round(ci[0], 4), round(ci[1], 4)]


class EvalRunSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run: int
    target: str
    version: int
    versions_seen: list[int]
    episodes: int
    success_rate: float
    mean_return: float
    success_ci95: tuple[float, float] | None = None
    seeds: list[int] | None = None  # evaluation.seeds (None: unseeded resets)
    #: An evaluation over several tasks: each task's rate and interval (see
    #: :class:`~joynexus.workflows.evaluation.TaskSuccess`).
    per_task: list[dict[str, Any]] | None = None


class TenantSummary(BaseModel):
    """What one tenant's workload did."""

    model_config = ConfigDict(extra="forbid")

    task: str
    state: str = "completed"
    jobs_completed: int = 0
    jobs_dropped: int = 0
    jobs_failed: int = 0
    final_version: int | None = None
    sft_heldout_error_initial: float | None = None
    sft_heldout_error_final: float | None = None
    rl_return_initial: float | None = None
    rl_return_final: float | None = None
    eval_success_rate: float | None = None
    success_rate_initial: float | None = None
    success_rate_final: float | None = None
    success_rate_ci95: tuple[float, float] | None = None
    success_rate_ci95_initial: tuple[float, float] | None = None
    eval_episodes: int | None = None
    eval_first_seed: int | None = None
    eval_runs: list[EvalRunSummary] = Field(default_factory=list)
    resumed_from_version: int | None = None
    errors: list[str] = Field(default_factory=list)
    output_dir: str | None = None


class RunSummary(BaseModel):
    """The whole run: tenants by id, plus timing."""

    model_config = ConfigDict(extra="forbid")

    run_dir: str
    wall_s: float
    tenants: dict[str, TenantSummary]

    def to_json(self) -> dict[str, Any]:
        """The JSON document: per-tenant entries at the top level, plus ``_run``."""
        doc: dict[str, Any] = {}
        for tenant, summary in sorted(self.tenants.items()):
            entry = summary.model_dump(exclude_none=True)
            for key in ("success_rate_ci95", "success_rate_ci95_initial"):
                if key in entry:
                    entry[key] = _rounded(entry[key])
            for key in ("eval_runs", "errors"):
                if not entry.get(key):
                    entry.pop(key, None)
            doc[tenant] = entry
        doc["_run"] = {"run_dir": self.run_dir, "wall_s": round(self.wall_s, 3)}
        return doc

    def write(self, path: str | Path) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        return out


class TenantProgress(BaseModel):
    """A progress-bar row: jobs completed against the target, and the current version."""

    model_config = ConfigDict(extra="forbid")

    tenant: str
    task: str
    completed: int
    target: int | None
    version: int | None
    done: bool = False
