"""Entry point of the ``joynexus`` command: imports every command module."""

from __future__ import annotations

from joynexus.cli import (
    control,  # noqa: F401  (registers its commands)
    data,  # noqa: F401  (data record, data info)
    demo,  # noqa: F401  (demo: the §5.1 mixture vs the isolated baseline)
    envs,  # noqa: F401  (env-server, bench envs)
    evaluate,  # noqa: F401  (eval: a served policy on named seeds, lerobot-eval's layout)
    models,  # noqa: F401
    models_bench,  # noqa: F401  (bench figure12, lora, canonicalize, ...)
    ray_cmds,  # noqa: F401  (scale rollout; --runtime for run)
    robots_bench,  # noqa: F401  (bench robots: openpi clients, batched vs sequential)
    run,  # noqa: F401  (run workloads on an in-process Master)
    serve,  # noqa: F401  (serve, tenants, submit, logs, artifacts, export)
    serving_bench,  # noqa: F401  (bench group-batching, bench serving)
    sim,  # noqa: F401  (simulate)
    spec,  # noqa: F401  (spec schema, spec check)
    tenant_store,  # noqa: F401  (tenants new-store)
    usage,  # noqa: F401  (usage of a run)
    workloads,  # noqa: F401  (status, pause, resume, cancel, load-weights)
)
from joynexus.cli.app import app

__all__ = ["app"]


if __name__ == "__main__":  # pragma: no cover
    app()
