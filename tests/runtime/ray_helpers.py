"""What the Ray runtime tests share: a run checked while its actors still live."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from joynexus.master.run import LocalRun
from joynexus.spec.workload import WorkloadSpec
from joynexus.workflows.compile import compile_workloads
from joynexus.workflows.summary import RunSummary, TenantProgress


def run_checked(
    specs: Sequence[WorkloadSpec],
    run: LocalRun,
    check: Callable[[LocalRun, RunSummary], None],
    on_progress: Callable[[list[TenantProgress]], None] | None = None,
) -> RunSummary:
    """Run ``specs`` to their end on ``run`` and ``check`` it while the actors live.

    What :func:`~joynexus.master.run.run_workloads` does, with the check before the run
    is closed (the demos exist: nothing to record).
    """
    compiled = compile_workloads(list(specs))

    async def body() -> RunSummary:
        try:
            await run.open(compiled, status=lambda _msg: None)
            await run.submit_all(compiled)
            await run.wait(on_progress)
            summary = run.summary()
            check(run, summary)
            return summary
        finally:
            await run.close()

    return asyncio.run(body())
