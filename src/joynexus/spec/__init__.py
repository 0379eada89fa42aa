"""Workload specifications: what a tenant declares (paper §4.1, Figure 3)."""

from joynexus.spec.workload import (
    AlgorithmSpec,
    BaseModelSpec,
    DatasetBinding,
    EvaluationSpec,
    SchedulingSpec,
    SuccessEvalSpec,
    TaskKind,
    WorkloadSpec,
    load_specs,
)

__all__ = [
    "AlgorithmSpec",
    "BaseModelSpec",
    "DatasetBinding",
    "EvaluationSpec",
    "SchedulingSpec",
    "SuccessEvalSpec",
    "TaskKind",
    "WorkloadSpec",
    "load_specs",
]
