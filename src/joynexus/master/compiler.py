"""The tenant creator (paper §4.1.1): a :class:`WorkloadSpec` checked against this
backend — the resident base model, the registered environment kinds, the dataset
roots, the server's limits, the backbone's camera slots — and compiled through
:func:`joynexus.workflows.compile.compile_workloads`."""

from __future__ import annotations

from typing import Any

from joynexus.api import WorkloadState
from joynexus.control.admission import GlobalLimit
from joynexus.data.record import SCRIPTED_EXPERT_KINDS
from joynexus.errors import DatasetError, JoyNexusError, PermissionDeniedError, SpecError
from joynexus.master.limits import MasterLimits, check_limits
from joynexus.master.records import WorkloadBook
from joynexus.master.tenant_datasets import in_tenant_terms, not_found, place_tenant_dataset
from joynexus.spec.workload import WorkloadSpec
from joynexus.workflows.compile import (
    DEFAULT_MAX_ACTIVE_ROLLOUTS,
    DEFAULT_MAX_ACTIVE_ROLLOUTS_PER_TENANT,
    CompiledWorkload,
    compile_workloads,
    rollout_limits,
)

__all__ = ["SpecCompiler", "global_limits"]


class SpecCompiler:
    """Validates and compiles specs for one tenant at a time (see module docstring)."""

    def __init__(self, book: WorkloadBook, limits: MasterLimits) -> None:
        self.book = book
        self.limits = limits

    def served_schemas(self, tenant_id: str, *, any_tenant: bool = False) -> dict[str, Any]:
        """Trainable tenants an evaluation may read: with a slot, or a live workload."""
        served = {t: wt.schema for t, wt in self.book.tenants.items()}
        for w in self.book.workloads.values():
            if w.compiled.config is not None and w.state is not WorkloadState.CANCELLED:
                served.setdefault(w.tenant_id, w.compiled.schema)
        if any_tenant:
            return served
        return {t: s for t, s in served.items() if t == tenant_id}

    def compile(self, spec: WorkloadSpec, tenant_id: str) -> CompiledWorkload:
        """Validate ``spec`` for ``tenant_id`` against this backend; its compiled form.

        Raises:
            PermissionDeniedError: the spec is for another tenant, or evaluates one.
            SpecError / DatasetError: the spec asks for something this server cannot
                do; ``details.fields`` names the offending fields.
            NotFoundError: the tenant has no dataset of the name ``dataset.path`` gives
                and the server cannot record one
                (:mod:`joynexus.master.tenant_datasets`).
        """
        if spec.tenant != tenant_id:
            raise PermissionDeniedError(
                f"spec.tenant {spec.tenant!r} is not the authenticated tenant {tenant_id!r}; "
                "a tenant submits workloads only for itself",
                field="tenant",
            )
        base = self.book.base
        spec = spec.model_copy(update={"output_dir": self.book.output_root})
        check_limits(spec, self.limits, self.book.base_model_id)
        placed = None
        if spec.dataset is not None and self.limits.tenant_datasets:
            # The tenant's own dataset, never another's; messages show its path only.
            placed = place_tenant_dataset(spec.dataset.path, tenant_id, self.limits.dataset_roots)
            recordable = spec.env is not None and spec.env.kind in SCRIPTED_EXPERT_KINDS
            if not placed.exists and not recordable:
                raise not_found(placed, tenant_id)
            dataset = spec.dataset.model_copy(update={"path": placed.path})
            spec = spec.model_copy(update={"dataset": dataset})
        if spec.init_from is not None and not self.limits.cross_tenant_eval:
            raise PermissionDeniedError(
                "init_from reads another tenant's (or a file's) checkpoint; on this server "
                "a tenant continues only its own policy (submit the next workload of the "
                "same tenant: it resumes from its checkpoint)",
                field="init_from",
            )
        if spec.evaluation is not None and not self.limits.cross_tenant_eval:
            others = sorted(set(spec.evaluation.targets) - {tenant_id})
            if others:
                raise PermissionDeniedError(
                    f"evaluation.targets {others} are other tenants; a tenant evaluates only "
                    f"its own policy ({tenant_id!r})",
                    field="evaluation.targets",
                )
        try:
            compiled = compile_workloads(
                [spec],
                allow_custom=True,
                served=self.served_schemas(tenant_id, any_tenant=self.limits.cross_tenant_eval),
                require_completion_target=False,
            ).workloads[0]
        except JoyNexusError as exc:
            if placed is None:
                raise
            raise in_tenant_terms(exc, placed) from None
        except OSError as exc:
            if placed is None:
                raise
            raise DatasetError(
                f"dataset.path {placed.written!r}: cannot read it ({exc.strerror})",
                field="dataset.path",
                fields=["dataset.path"],
            ) from None
        slots = base.num_camera_slots
        if len(compiled.schema.cameras) > slots:
            raise SpecError(
                f"schema has {len(compiled.schema.cameras)} cameras "
                f"{compiled.schema.camera_names}; the resident base model has {slots} camera "
                "slots",
                field="schema.cameras",
                fields=["schema.cameras"],
                allowed_max=slots,
            )
        # The head's family refuses a base it cannot run on (a π0 expert needs a π0 base
        # whose checkpoint the schema fits) before any tenant state exists.
        compiled.spec.action_module.check_base(base, compiled.schema)
        return compiled

    def compile_for_report(self, spec: WorkloadSpec, tenant_id: str) -> CompiledWorkload:
        """``spec`` compiled without this server's limits (a stored workload that can no
        longer run here is still reported on)."""
        return compile_workloads(
            [spec],
            allow_custom=True,
            require_completion_target=False,
            served=self.served_schemas(tenant_id, any_tenant=True),
        ).workloads[0]


def global_limits() -> list[GlobalLimit]:
    # The §5.1 bounds compile_workloads attaches to every run (same defaults).
    return rollout_limits(DEFAULT_MAX_ACTIVE_ROLLOUTS, DEFAULT_MAX_ACTIVE_ROLLOUTS_PER_TENANT)
