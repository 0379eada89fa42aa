"""What the Master's tenant creator accepts on this server (its limits)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ConfigDict, Field

from joynexus.envs.limits import EnvLimits, env_limit_problems
from joynexus.errors import SpecError

if TYPE_CHECKING:
    from joynexus.spec.workload import WorkloadSpec

__all__ = ["MasterLimits", "check_limits"]


class MasterLimits(EnvLimits):
    """What the tenant creator accepts on this server (errors quote these). The
    environment limits (``max_num_envs``, ``max_image_size``, ``denied_env_kinds``) are
    :class:`~joynexus.envs.limits.EnvLimits`', shared with HTTP environment sessions.

    Args:
        max_num_envs: Sub-envs of one workload's session.
        max_horizon: Rollout decisions per RL job.
        max_completion_target: Training jobs one workload may ask for.
        max_samples_per_job: SFT samples per job.
        max_microbatch_size: Samples per optimizer step.
        max_image_size: Side of environment camera images.
        max_eval_episodes: Episodes per evaluation run.
        max_active_workloads_per_tenant: Non-terminal workloads per tenant (at most one
            of them trainable: rl, sft or custom).
        dataset_roots: Directories holding SFT datasets. With ``tenant_datasets`` (a
            server) each tenant has its own folder ``<root>/<tenant>/`` in each, and a
            spec names one of its own datasets relative to it
            (:mod:`joynexus.master.tenant_datasets`; the last root receives datasets
            recorded on first use); without, a dataset must lie under one of them.
        tenant_datasets: Datasets are per tenant under the roots (a shared server);
            false for a single-user ``joynexus run``, whose local paths are read as
            written.
        denied_env_kinds: Environment kinds workloads may not use.
        cross_tenant_eval: An evaluation may target other tenants (a single-user
            ``joynexus run``); a shared server keeps every tenant to its own policy.
    """

    model_config = ConfigDict(extra="forbid")

    max_horizon: int = Field(default=1024, ge=1)
    max_completion_target: int = Field(default=100_000, ge=1)
    max_samples_per_job: int = Field(default=65_536, ge=1)
    max_microbatch_size: int = Field(default=4096, ge=1)
    max_eval_episodes: int = Field(default=1000, ge=1)
    max_active_workloads_per_tenant: int = Field(default=2, ge=1)
    dataset_roots: list[Path] = Field(default_factory=list)
    tenant_datasets: bool = True
    cross_tenant_eval: bool = False


def check_limits(spec: WorkloadSpec, lim: MasterLimits, base_model_id: str) -> None:
    """Check ``spec`` against this server's limits and resident base model.

    Raises:
        SpecError: every field that exceeds a limit, named in ``details.fields``.
    """
    problems: list[tuple[str, str]] = []
    if spec.base_model.id != base_model_id:
        problems.append(
            (
                "base_model.id",
                f"{spec.base_model.id!r} is not resident here; allowed: [{base_model_id!r}]",
            )
        )
    checks: list[tuple[str, int | None, int]] = [
        ("algorithm.horizon", spec.algorithm.horizon, lim.max_horizon),
        ("algorithm.microbatch_size", spec.algorithm.microbatch_size, lim.max_microbatch_size),
        ("algorithm.samples_per_job", spec.algorithm.samples_per_job, lim.max_samples_per_job),
        (
            "scheduling.completion_target",
            spec.scheduling.completion_target,
            lim.max_completion_target,
        ),
    ]
    if spec.env is not None:
        problems.extend(
            (p.field, p.message) for p in env_limit_problems(spec.env, lim, prefix="env.")
        )
    if spec.evaluation is not None:
        checks.append(
            ("evaluation.episodes", spec.evaluation.episodes_per_run, lim.max_eval_episodes)
        )
    for name, value, limit in checks:
        if value is not None and value > limit:
            problems.append((name, f"{value} exceeds this server's limit of {limit}"))
    # A served tenant's dataset is placed in its own folder by the SpecCompiler.
    if spec.dataset is not None and not lim.tenant_datasets:
        path = spec.dataset.path.resolve()
        roots = [r.resolve() for r in lim.dataset_roots]
        if not any(path.is_relative_to(r) for r in roots):
            problems.append(
                (
                    "dataset.path",
                    f"{spec.dataset.path} is outside the dataset roots of this server; "
                    f"allowed roots: {[str(r) for r in roots]}",
                )
            )
    if problems:
        raise SpecError(
            "the workload spec exceeds what this server allows:\n"
            + "\n".join(f"  {f}: {m}" for f, m in problems),
            fields=[f for f, _ in problems],
            problems={f: m for f, m in problems},
        )
