"""Starting a tenant's workload on the execution plane.

The steps every host of the workflow loops takes — the Master Service for one submitted
workload, the runtimes for each workload of a run — so they are written once:

* :func:`open_session`: the simulator session an RL or evaluation workload rolls out in;
* :func:`start_tenant`: the tenant as the loops see it. Evaluation is read-only and gets
  no slot; a trainable workload gets its training slot (an SFT tenant adopts its
  dataset's normalization), resumes from its latest checkpoint, and is served the
  exported parameters;
* :func:`start_producer`: the workload's own loop (RL producer, SFT producer or
  evaluator);
* :func:`start_stage_loops` / :func:`start_actor_forward`: the loops shared by every
  tenant (actor consumer and advantage stage; the actor-forward stage on demand).

What differs between hosts stays with them: the Master's admission bookkeeping and slot
release, the runtime's run-to-completion wait and summary.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from joynexus.errors import JoyNexusError, NotFoundError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.services.protocols import (
    EnvironmentServiceAPI,
    InferenceModelServiceAPI,
    TrainingModelServiceAPI,
)
from joynexus.spec.workload import TaskKind
from joynexus.workflows.actor import actor_consumer
from joynexus.workflows.compile import CompiledWorkload
from joynexus.workflows.context import MetricsLog, WorkflowContext, WorkflowTenant
from joynexus.workflows.evaluation import evaluator
from joynexus.workflows.rl import rl_producer
from joynexus.workflows.sft import (
    SFTSource,
    heldout_action_error,
    sft_producer,
    with_normalization,
)
from joynexus.workflows.stages import actor_forward_stage, advantage_stage

__all__ = [
    "StartedTenant",
    "open_session",
    "start_actor_forward",
    "start_producer",
    "start_stage_loops",
    "start_tenant",
    "uses_actor_forward",
]


@dataclass
class StartedTenant:
    """A tenant whose workload is ready to run.

    Attributes:
        tenant: The tenant as the loops see it.
        source: The SFT dataset the producer reads (SFT only).
        resumed_from: Version of the checkpoint restored; None when none was.
        heldout_initial: Held-out action error before training (SFT, when measured).
    """

    tenant: WorkflowTenant
    source: SFTSource | None = None
    resumed_from: int | None = None
    heldout_initial: float | None = None


async def open_session(env: EnvironmentServiceAPI, c: CompiledWorkload) -> str | None:
    """Create the simulator session an RL or evaluation workload rolls out in.

    An SFT workload gets one when it measures its success rate (``success_eval``).

    Returns:
        Its id; None for workloads that roll nothing out (SFT without
        ``success_eval``, custom) or have no env.
    """
    measured = c.task is TaskKind.SFT and c.spec.success_eval is not None
    if c.spec.env is None or (c.task not in (TaskKind.RL, TaskKind.EVAL) and not measured):
        return None
    return (await env.create_session(c.tenant_id, c.spec.env)).session_id


async def start_tenant(
    c: CompiledWorkload,
    *,
    base: ResidentBaseModel,
    training: TrainingModelServiceAPI,
    inference: InferenceModelServiceAPI,
    metrics: MetricsLog,
    session_id: str | None,
    serve: bool,
    skip_incompatible_checkpoint: bool = False,
    heldout_samples: int | None = None,
    workload_id: str | None = None,
) -> StartedTenant:
    """Give ``c``'s tenant its slots and resume it from its latest checkpoint.

    Writes ``resumed`` (and, when skipped, ``restore_skipped``) to ``metrics``.

    Args:
        c: The compiled workload.
        base: The resident base model (an evaluation's schema signature).
        training / inference: The services the tenant gets a slot in.
        metrics: The tenant's workflow records.
        session_id: Its simulator session (:func:`open_session`).
        serve: Whether the loops keep the served weights current (ignored for
            evaluation, which serves nothing of its own).
        skip_incompatible_checkpoint: Start fresh, instead of raising, when the latest
            checkpoint does not fit the tenant (another interface).
        heldout_samples: Measure an SFT tenant's initial held-out action error on
            this many frames (None: do not measure).
        workload_id: The Master workload the tenant runs for (tags its jobs).

    Raises:
        JoyNexusError: a slot could not be created, or (unless skipped) the checkpoint
            does not fit.
    """
    tid = c.tenant_id
    if c.config is None:  # evaluation: read-only, no slot of its own
        return StartedTenant(
            WorkflowTenant(
                spec=c.spec,
                schema=c.schema,
                schema_signature=base.signature_for(c.schema),
                config=None,
                metrics=metrics,
                session_id=session_id,
                serve=False,
                workload_id=workload_id,
            )
        )
    config, source = c.config, None
    if c.task is TaskKind.SFT:  # the dataset's normalization becomes the tenant's
        source = await asyncio.to_thread(SFTSource.open, c.spec, c.schema)
        config = with_normalization(config, source)
    info = await training.add_tenant(config)
    resumed: int | None = None
    applied = 0
    try:
        resumed = await training.restore(tid)
        applied = int(training.checkpoint_ledger(tid).get("jobs_applied", 0))
    except NotFoundError:
        pass  # no checkpoint yet
    except JoyNexusError as exc:
        if not skip_incompatible_checkpoint:
            raise
        metrics.write("restore_skipped", reason=str(exc)[:300])
    payload = await training.export_params(tid)
    await inference.add_tenant(config, payload)
    tenant = WorkflowTenant(
        spec=c.spec,
        schema=c.schema,
        schema_signature=info.schema_signature,
        config=config,
        metrics=metrics,
        session_id=session_id,
        serve=serve,
        last_checkpoint_version=resumed or 0,
        workload_id=workload_id,
        jobs_applied=applied,
    )
    if resumed:
        metrics.write("resumed", policy_version=resumed)
    started = StartedTenant(tenant, source, resumed)
    if source is not None and heldout_samples is not None:
        started.heldout_initial = await heldout_action_error(
            inference, tid, source, max_samples=heldout_samples
        )
    return started


def start_producer(
    ctx: WorkflowContext, c: CompiledWorkload, started: StartedTenant
) -> asyncio.Task[Any]:
    """Start the workload's own loop: ``rl:<tenant>``, ``sft:<tenant>`` or ``eval:<tenant>``.

    Raises:
        ValueError: a custom workload (endpoints only: it has no loop).
    """
    tenant, tid = started.tenant, c.tenant_id
    if c.task is TaskKind.RL:
        return asyncio.create_task(rl_producer(ctx, tenant), name=f"rl:{tid}")
    if c.task is TaskKind.SFT:
        assert started.source is not None, "an SFT tenant is started with its source"
        return asyncio.create_task(sft_producer(ctx, tenant, started.source), name=f"sft:{tid}")
    if c.task is TaskKind.EVAL:
        return asyncio.create_task(evaluator(ctx, tenant), name=f"eval:{tid}")
    raise ValueError(f"a {c.task.value} workload has no producer loop; expected rl, sft or eval")


def start_stage_loops(ctx: WorkflowContext, *, prefix: str = "") -> list[asyncio.Task[None]]:
    """Start the loops every tenant shares: actor consumer and advantage stage."""
    return [
        asyncio.create_task(actor_consumer(ctx), name=f"{prefix}actor"),
        asyncio.create_task(advantage_stage(ctx), name=f"{prefix}advantages"),
    ]


def uses_actor_forward(c: CompiledWorkload) -> bool:
    """Whether ``c``'s algorithm needs the shared actor-forward stage."""
    return c.config is not None and c.task is TaskKind.RL and c.config.algorithm.actor_forward


def start_actor_forward(ctx: WorkflowContext, *, prefix: str = "") -> asyncio.Task[None]:
    """Start the shared actor-forward stage (once, when a tenant first needs it)."""
    return asyncio.create_task(actor_forward_stage(ctx), name=f"{prefix}actor_forward")
