"""Workload failures that are the service's, not the workload's (paper §4.1.3).

A workload ended by a global restart whose retries it spent, or by its tenant's spent
recovery budget, failed because the service could not keep it running — its jobs and
its spec are fine. Such a workload keeps its checkpoints, and an operator may resume
it (``POST /v1/workloads/{id}/resume``:
:meth:`~joynexus.master.lifecycle.Lifecycle.resume`) once the cause is fixed; a workload
whose own jobs failed may not.
"""

from __future__ import annotations

__all__ = ["BUDGET_SPENT", "GLOBAL_RESTART", "service_failure"]

#: Prefix of the error of a workload failed by a global restart.
GLOBAL_RESTART = "global_restart:"
#: Prefix of the error of a workload whose tenant's recovery budget is spent.
BUDGET_SPENT = "recovery budget spent"


def service_failure(error: str | None) -> bool:
    """Whether a failed workload's ``error`` says the service failed it (resumable)."""
    return error is not None and error.startswith((GLOBAL_RESTART, BUDGET_SPENT))
