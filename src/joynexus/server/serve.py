"""A live server: the execution plane, the Master Service and the HTTP app around them.

:func:`build_plane` loads the resident base model and builds the long-lived services
(durable Training Scheduler in the run directory, Training Queue, Environment / Training
/ Inference Model Services) exactly once; :func:`build_live_app` wraps them in a
:class:`~joynexus.control.master.MasterService` and the FastAPI app with the workload
and model routers, starting the services and the Master's shared loops in the app's
lifespan (inside the server's event loop) and stopping them at shutdown.

Unlike :mod:`joynexus.server.app`, this module imports torch: it is what
``joynexus serve`` and the end-to-end tests run.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from joynexus.control.master import MasterService
from joynexus.control.scheduler import TrainingScheduler
from joynexus.control.workloads import MasterLimits
from joynexus.models.backbone import ResidentBaseModel
from joynexus.queues.training import TrainingQueue
from joynexus.runtime.embedded import RuntimeConfig, load_base_model
from joynexus.server.app import create_app
from joynexus.server.auth import TenantStore
from joynexus.server.config import ServerConfig
from joynexus.server.routes import models, workloads
from joynexus.server.state import ServiceRegistry
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import BaseModelSpec
from joynexus.utils.clock import Clock, SystemClock

__all__ = ["ExecutionPlane", "LiveServer", "build_live_app", "build_plane", "ensure_admin_key"]

MASTER = "master"


@dataclass
class ExecutionPlane:
    """The long-lived services one server hosts every workload on."""

    base: ResidentBaseModel
    base_model_id: str
    scheduler: TrainingScheduler
    queue: TrainingQueue
    env: EnvironmentService
    training: TrainingModelService
    inference: InferenceModelService


def build_plane(
    run_dir: Path,
    base_model: BaseModelSpec,
    *,
    config: RuntimeConfig | None = None,
    clock: Clock | None = None,
) -> ExecutionPlane:
    """Load the base model and build the services (not started yet).

    Jobs a previous server process left in flight are failed ``runtime_restarted``:
    their partitions lived in that process's memory.
    """
    cfg = config or RuntimeConfig()
    clk = clock or SystemClock()
    run_dir.mkdir(parents=True, exist_ok=True)
    base = load_base_model(base_model, run_dir / "models")
    scheduler = TrainingScheduler.open(
        run_dir / "scheduler.sqlite",
        clock=clk,
        lease_ttl_s=cfg.lease_ttl_s,
        producer_lease_ttl_s=cfg.producer_lease_ttl_s,
    )
    for job in scheduler.list_jobs():
        if not job.is_terminal:
            scheduler.fail(job.job_id, "runtime_restarted")
    queue = TrainingQueue()
    env = EnvironmentService(cfg.env, clock=clk)
    training = TrainingModelService(base, queue, output_dir=run_dir / "outputs", clock=clk)
    inference = InferenceModelService(
        base, env, queue, max_batch_size=cfg.max_batch_size, max_wait_s=cfg.max_wait_s, clock=clk
    )
    return ExecutionPlane(base, base_model.id, scheduler, queue, env, training, inference)


@dataclass
class LiveServer:
    app: FastAPI
    master: MasterService
    plane: ExecutionPlane
    tenants: TenantStore


def build_live_app(
    plane: ExecutionPlane,
    tenants: TenantStore,
    *,
    output_root: Path,
    config: ServerConfig | None = None,
    limits: MasterLimits | None = None,
    clock: Clock | None = None,
    poll_s: float = 0.05,
) -> LiveServer:
    """The HTTP app over ``plane`` with a Master Service; lifespan starts and stops both."""
    clk = clock or SystemClock()
    master = MasterService(
        base=plane.base,
        base_model_id=plane.base_model_id,
        scheduler=plane.scheduler,
        queue=plane.queue,
        env=plane.env,
        training=plane.training,
        inference=plane.inference,
        output_root=output_root,
        limits=limits,
        clock=clk,
        poll_s=poll_s,
    )
    services = ServiceRegistry(
        tenants=tenants,
        scheduler=plane.scheduler,
        training_queue=plane.queue,
        environment=plane.env,
        extras={MASTER: master},
    )
    app = create_app(
        config=config,
        services=services,
        clock=clk,
        extra_routers=(workloads.router, models.router),
    )
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[None]:
        await plane.inference.start()
        await master.start()
        try:
            async with inner(a):
                yield
        finally:
            await master.aclose()
            await plane.inference.stop()
            await plane.env.aclose()

    app.router.lifespan_context = lifespan
    return LiveServer(app, master, plane, tenants)


def ensure_admin_key(store: TenantStore, path: Path) -> bool:
    """Write a new admin key to ``path`` (mode 0600) unless the file exists.

    Returns:
        True when a key was created (first start).
    """
    if path.is_file():
        return False
    issued = store.create_admin_key(label="serve")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(issued.api_key + "\n")
    return True
