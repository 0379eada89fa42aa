"""Compile workload specs onto the services and the Training Scheduler.

:func:`compile_workloads` turns the :class:`~joynexus.spec.workload.WorkloadSpec` s of one
run into what the Master Service needs, and runs every capability check *before*
anything starts (no model is loaded, no simulator is spawned):

* the tenant's :class:`DataSchema`: the spec's own (or its preset), else the schema of
  its environment (:func:`joynexus.envs.env_schema`), else one derived from the SFT
  dataset's features;
* the tenant's :class:`~joynexus.services.tenancy.TenantConfig` (trainable tenants);
* the scheduler's :class:`AdmissionPolicy` per tenant–task pair and the global limits
  of §5.1 (active rollouts ≤ 3 globally and ≤ 1 per tenant by default);
* capability checks: the env kind is registered and runnable here (its Python modules
  and what its ``ready`` check needs, e.g. LIBERO's scene assets), the SFT dataset
  exists (or can be recorded from the spec's env) and matches the schema, evaluation
  targets and ``init_from`` name trainable tenants of the same run whose interface
  matches (or ``init_from`` a checkpoint directory), and every workload shares one base
  model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from joynexus.control.admission import AdmissionPolicy, GlobalLimit
from joynexus.control.job import TaskType
from joynexus.data.lerobot_format import FeatureSpec
from joynexus.data.reader import LeRobotDataset
from joynexus.data.record import SCRIPTED_EXPERT_KINDS
from joynexus.data.sft import SFTBatchBuilder, SFTFeatureMap
from joynexus.envs.registry import env_schema, unavailable_reason
from joynexus.errors import DatasetError, JoyNexusError, SpecError
from joynexus.interop.lerobot import SchemaDims, check_lerobot_base
from joynexus.models.checkpoints.payload import MANIFEST_FILE
from joynexus.models.normalization import NormMode
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.services.tenancy import TenantConfig
from joynexus.spec.workload import BaseModelSpec, TaskKind, WorkloadSpec
from joynexus.workflows.context import ROLLOUT_ROLE

__all__ = [
    "DOMAIN",
    "CompiledRun",
    "CompiledWorkload",
    "check_spec_files",
    "compile_workloads",
    "dataset_schema",
    "feature_map_of",
    "norm_mode_of",
    "policy_key",
]

#: The scheduling domain of every job this runtime creates (paper App. A.4).
DOMAIN = "vla"
#: §5.1 defaults: at most 3 rollouts being produced at once, at most 1 per tenant.
DEFAULT_MAX_ACTIVE_ROLLOUTS = 3
DEFAULT_MAX_ACTIVE_ROLLOUTS_PER_TENANT = 1


def policy_key(tenant_id: str, task: TaskKind | TaskType | str) -> str:
    """The scheduler's policy key of one tenant–task pair."""
    return f"{tenant_id}/{task}"


@dataclass(frozen=True)
class CompiledWorkload:
    """One spec, checked and resolved.

    Attributes:
        spec: The validated spec.
        schema: The tenant's resolved data schema.
        config: Tenant configuration of a trainable (rl/sft) tenant; None for eval.
        task_type: Scheduler task type (None for eval: evaluation creates no jobs).
        admission: Admission policy of the tenant–task pair (None for eval).
        needs_recording: The SFT dataset is missing and will be recorded from the env.
    """

    spec: WorkloadSpec
    schema: DataSchema
    config: TenantConfig | None
    task_type: TaskType | None
    admission: AdmissionPolicy | None
    needs_recording: bool = False

    @property
    def tenant_id(self) -> str:
        return self.spec.tenant

    @property
    def task(self) -> TaskKind:
        return self.spec.task


@dataclass(frozen=True)
class CompiledRun:
    """Every workload of one run plus the run-wide settings."""

    workloads: list[CompiledWorkload]
    base_model: BaseModelSpec
    global_limits: list[GlobalLimit] = field(default_factory=list)

    def by_tenant(self) -> dict[str, CompiledWorkload]:
        return {w.tenant_id: w for w in self.workloads}


def feature_map_of(spec: WorkloadSpec, schema: DataSchema) -> SFTFeatureMap | None:
    """The explicit dataset feature map of an SFT spec, or None to infer it."""
    ds = spec.dataset
    if ds is None or ds.cameras is None:
        return None
    state = ds.state if schema.state_dim > 0 else None
    return SFTFeatureMap(cameras=dict(ds.cameras), state=state, action=ds.action)


def dataset_schema(
    features: dict[str, FeatureSpec], *, name: str = "dataset", state_key: str | None = None
) -> DataSchema:
    """A schema derived from a LeRobot dataset's features.

    Cameras are the image/video features (``observation.images.<cam>`` → ``<cam>``),
    the state is ``observation.state`` and the action ``action``; the chunk length is 1.

    Raises:
        DatasetError: the dataset has no camera or no ``action`` feature.
    """
    cams: dict[str, CameraSpec] = {}
    for key, feat in features.items():
        if feat.is_visual:
            h, w, c = feat.image_hwc()
            cam = key.removeprefix("observation.images.").removeprefix("observation.")
            cams[cam.replace(".", "_")] = CameraSpec(height=h, width=w, channels=c)
    action = features.get("action")
    if not cams or action is None:
        raise DatasetError(
            f"cannot derive a schema from dataset features {sorted(features)}: it needs at "
            "least one image/video feature and an 'action' feature; declare 'schema' in the spec"
        )
    state = features.get(state_key or "observation.state")
    return DataSchema(
        name=name,
        cameras=cams,
        state_dim=int(state.shape[0]) if state is not None and state.shape else 0,
        action_dim=int(action.shape[0]),
    )


def _check_env(spec: WorkloadSpec) -> DataSchema | None:
    if spec.env is None:
        return None
    # SpecError listing the known kinds; then what the kind needs here (modules, assets).
    reason = unavailable_reason(spec.env.kind)
    if reason is not None:
        raise SpecError(
            f"tenant {spec.tenant!r}: env kind {spec.env.kind!r} cannot run here: {reason}",
            field="env.kind",
        )
    return env_schema(spec.env)


def _resolve_schema(spec: WorkloadSpec, env: DataSchema | None) -> DataSchema:
    declared = spec.resolved_schema()
    if declared is not None:
        return declared
    if env is not None:
        return env
    assert spec.dataset is not None  # the spec's shape rules guarantee env or dataset
    if not (spec.dataset.path / "meta" / "info.json").is_file():
        raise DatasetError(
            f"tenant {spec.tenant!r}: dataset {spec.dataset.path} does not exist and the spec "
            "has neither a 'schema' nor an 'env' to derive one from",
            field="dataset.path",
        )
    probe = LeRobotDataset(spec.dataset.path)
    return dataset_schema(probe.features, name=spec.tenant, state_key=spec.dataset.state)


def _check_dataset(spec: WorkloadSpec, schema: DataSchema) -> bool:
    """Check the SFT dataset against the schema; True when it must be recorded first."""
    ds = spec.dataset
    assert ds is not None
    if not (ds.path / "meta" / "info.json").is_file():
        if ds.path.exists() and any(ds.path.iterdir()):
            raise DatasetError(
                f"tenant {spec.tenant!r}: {ds.path} exists but is not a LeRobot dataset "
                "(no meta/info.json)",
                field="dataset.path",
            )
        if spec.env is not None and spec.env.kind in SCRIPTED_EXPERT_KINDS:
            return True
        raise DatasetError(
            f"tenant {spec.tenant!r}: dataset {ds.path} does not exist; record one with "
            "`joynexus data record`, or give the spec an 'env' of a kind with a scripted "
            f"expert ({', '.join(SCRIPTED_EXPERT_KINDS)}) so `joynexus run` records it",
            field="dataset.path",
        )
    try:
        SFTBatchBuilder(ds.path, schema, feature_map_of(spec, schema), norm_mode=norm_mode_of(spec))
    except JoyNexusError as exc:
        raise DatasetError(
            f"tenant {spec.tenant!r}: dataset {ds.path} does not match the tenant schema: {exc}",
            field="dataset",
        ) from exc
    return False


def norm_mode_of(spec: WorkloadSpec) -> NormMode:
    """The SFTBatchBuilder normalisation of a spec's dataset.

    The builder supports ``mean_std`` and ``quantile``; ``none`` falls back to
    ``mean_std`` (the head trains on normalised targets either way).
    """
    assert spec.dataset is not None
    return "quantile" if spec.dataset.normalization == "quantile" else "mean_std"


def _same_interface(a: DataSchema, b: DataSchema) -> bool:
    return (
        a.cameras == b.cameras
        and a.state_dim == b.state_dim
        and a.action_dim == b.action_dim
        and a.action_chunk == b.action_chunk
    )


def _admission(spec: WorkloadSpec) -> AdmissionPolicy:
    sched = spec.scheduling
    max_in_flight = sched.max_in_flight
    if spec.task is TaskKind.SFT:
        # SFT prefetch is bounded by admission: never more than `prefetch` prepared jobs.
        max_in_flight = min(max_in_flight or sched.prefetch, sched.prefetch)
    return AdmissionPolicy(
        priority=sched.priority,
        max_in_flight=max_in_flight,
        completion_target=sched.completion_target,
    )


def _check_eval_tasks(w: CompiledWorkload) -> None:
    """An evaluation over several tasks: each task exists and serves the same interface."""
    from joynexus.workflows.evaluation import evaluation_tasks

    ev, env = w.spec.evaluation, w.spec.env
    if ev is None or ev.tasks is None:
        return
    if env is None:
        raise SpecError(
            f"tenant {w.tenant_id!r}: evaluation.tasks needs an env to run the tasks in",
            field="evaluation.tasks",
        )
    for task in evaluation_tasks(env, ev.tasks):
        try:
            schema = env_schema(env.model_copy(update={"task": task}))
        except SpecError as exc:
            raise SpecError(
                f"tenant {w.tenant_id!r}: evaluation task {task!r}: {exc.message}",
                field="evaluation.tasks",
            ) from exc
        if not _same_interface(schema, w.schema):
            raise SpecError(
                f"tenant {w.tenant_id!r}: evaluation task {task!r} produces a different "
                "interface than the env's task (cameras, state/action dims, chunk)",
                field="evaluation.tasks",
            )


def _check_init_from(w: CompiledWorkload, trainable: Mapping[str, DataSchema]) -> None:
    """``init_from`` names a trainable tenant of the same interface, or a checkpoint."""
    src = w.spec.init_from
    if src is None:
        return
    source = trainable.get(src)
    if source is None:
        if not (Path(src) / MANIFEST_FILE).is_file():
            raise SpecError(
                f"tenant {w.tenant_id!r}: init_from {src!r} is neither a trainable tenant of "
                f"this run ({sorted(trainable)}) nor a checkpoint directory (with a "
                f"{MANIFEST_FILE})",
                field="init_from",
            )
        return
    if not _same_interface(source, w.schema):
        raise SpecError(
            f"tenant {w.tenant_id!r}: init_from tenant {src!r} has another interface "
            "(cameras, state/action dims, chunk); its weights cannot start this policy",
            field="init_from",
        )


def compile_workloads(
    specs: Sequence[WorkloadSpec],
    *,
    max_active_rollouts: int | None = DEFAULT_MAX_ACTIVE_ROLLOUTS,
    max_active_rollouts_per_tenant: int | None = DEFAULT_MAX_ACTIVE_ROLLOUTS_PER_TENANT,
    require_completion_target: bool = True,
    allow_custom: bool = False,
    served: Mapping[str, DataSchema] | None = None,
) -> CompiledRun:
    """Check and compile the workloads of one run.

    Args:
        specs: The run's specs (tenant names must be unique).
        max_active_rollouts: Global bound on RL jobs being produced at once.
        max_active_rollouts_per_tenant: The same bound per tenant.
        require_completion_target: Every training workload must declare a completion
            target (a run must end).
        allow_custom: Accept ``custom`` workloads (endpoints only: a slot, no loops).
            Only a long-lived server (the Master Service) hosts them.
        served: Tenants already trainable outside these specs (a long-lived server's
            resident slots) and their schemas; evaluation targets may name them.

    Raises:
        SpecError: no specs, duplicate tenants, different base models, an unknown or
            unavailable env kind, a bad evaluation target, a missing completion target.
        DatasetError: an SFT dataset is missing (and cannot be recorded) or does not
            match the schema.
    """
    if not specs:
        raise SpecError("no workloads given")
    tenants = [s.tenant for s in specs]
    dupes = sorted({t for t in tenants if tenants.count(t) > 1})
    if dupes:
        raise SpecError(f"tenant names must be unique within a run, repeated: {dupes}")
    base_ids = sorted({s.base_model.id for s in specs})
    if len(base_ids) > 1:
        raise SpecError(
            f"all workloads of a run share one resident base model; got {base_ids}",
            field="base_model.id",
        )
    compiled: list[CompiledWorkload] = []
    for spec in specs:
        env = _check_env(spec)
        schema = _resolve_schema(spec, env)
        # A LeRobot policy as base model is checked here, before anything loads it.
        check_lerobot_base(
            spec.base_model.id,
            SchemaDims(
                state_dim=schema.state_dim,
                action_dim=schema.action_dim,
                action_chunk=schema.action_chunk,
            ),
        )
        if env is not None and spec.task is not TaskKind.SFT and not _same_interface(env, schema):
            raise SpecError(
                f"tenant {spec.tenant!r}: the declared schema does not match what env "
                f"{spec.env.kind if spec.env else ''!r} produces ({env.model_dump()})",
                field="schema",
            )
        if spec.task is TaskKind.EVAL:
            compiled.append(CompiledWorkload(spec, schema, None, None, None))
            continue
        if spec.task is TaskKind.CUSTOM:
            if not allow_custom:
                raise SpecError(
                    f"tenant {spec.tenant!r}: task 'custom' (endpoints only) runs on a "
                    "server (`joynexus serve`); `joynexus run` accepts rl, sft and eval",
                    field="task",
                )
            config = TenantConfig.from_spec(spec, schema)
            compiled.append(CompiledWorkload(spec, schema, config, None, None))
            continue
        if require_completion_target and spec.scheduling.completion_target is None:
            raise SpecError(
                f"tenant {spec.tenant!r}: `joynexus run` needs scheduling.completion_target "
                "(the number of training jobs after which the workload ends)",
                field="scheduling.completion_target",
            )
        recording = _check_dataset(spec, schema) if spec.task is TaskKind.SFT else False
        task_type = TaskType.RL if spec.task is TaskKind.RL else TaskType.SFT
        config = TenantConfig.from_spec(spec, schema)
        compiled.append(
            CompiledWorkload(spec, schema, config, task_type, _admission(spec), recording)
        )
    trainable_schemas = dict(served or {})
    trainable_schemas.update({w.tenant_id: w.schema for w in compiled if w.config is not None})
    for w in compiled:
        if w.spec.evaluation is None:
            continue
        _check_eval_tasks(w)
        for target in w.spec.evaluation.targets:
            target_schema = trainable_schemas.get(target)
            if target_schema is None and target == w.tenant_id:
                raise SpecError(
                    f"tenant {target!r} has no policy to evaluate yet: an rl, sft or custom "
                    "workload of its own gives it one (submit it first, or list it in the "
                    "same `joynexus run`)",
                    field="evaluation.targets",
                )
            if target_schema is None:
                raise SpecError(
                    f"tenant {w.tenant_id!r}: evaluation target {target!r} is not a trainable "
                    f"tenant of this run; trainable tenants: {sorted(trainable_schemas)}",
                    field="evaluation.targets",
                )
            if not _same_interface(target_schema, w.schema):
                raise SpecError(
                    f"tenant {w.tenant_id!r}: evaluation env produces a different interface "
                    f"than target {target!r} was trained on (cameras, state/action dims, chunk)",
                    field="evaluation.targets",
                )
    for w in compiled:
        _check_init_from(w, trainable_schemas)
    limits = rollout_limits(max_active_rollouts, max_active_rollouts_per_tenant)
    return CompiledRun(workloads=compiled, base_model=specs[0].base_model, global_limits=limits)


def rollout_limits(max_active: int | None, per_tenant: int | None) -> list[GlobalLimit]:
    """The §5.1 bounds on active rollouts. They cover the workloads' own rollout jobs
    only: jobs a tenant reserves by hand over the API (roles ``<tenant>/<role>``)
    neither count against them nor can hold a place (the server bounds those per
    tenant)."""
    return [
        GlobalLimit(
            task_type=TaskType.RL,
            max_active=max_active,
            max_active_per_tenant=per_tenant,
            producer_roles=frozenset({ROLLOUT_ROLE}),
        )
    ]


def check_spec_files(paths: Sequence[str | Path]) -> CompiledRun:
    """Load spec files and run every check ``joynexus run`` runs before it starts.

    The one validation path of ``joynexus run`` and ``joynexus spec check``: the specs'
    shape (:func:`~joynexus.spec.workload.load_specs`), then their capabilities on this
    machine (:func:`compile_workloads`: env kinds registered and runnable, simulator
    assets present, datasets, evaluation targets, one base model).

    Raises:
        SpecError / DatasetError: the first problem found, with what is allowed.
    """
    from joynexus.spec.workload import load_specs

    specs = [s for path in paths for s in load_specs(path)]
    return compile_workloads(specs)


def dataset_root(spec: WorkloadSpec) -> Path:
    """The SFT dataset directory of a spec."""
    if spec.dataset is None:
        raise SpecError(f"tenant {spec.tenant!r} has no dataset")
    return spec.dataset.path
