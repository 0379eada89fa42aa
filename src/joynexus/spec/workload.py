"""The workload spec: one tenant's declared intent, validated before anything starts.

A spec names the base model, the task (``rl`` | ``sft`` | ``eval``), the tenant's action
module and optimizer, where data comes from (an environment for RL and evaluation, a
LeRobot dataset for SFT), the algorithm, the scheduling knobs of the Training Scheduler,
and where artifacts go. It is plain data (YAML or JSON); ``joynexus run`` and the Master
Service compile it onto the services.

Validation happens in two layers, both before any service starts:

* **Shape** (this module, pydantic): unknown keys, wrong types, out-of-range numbers,
  and cross-field rules (RL needs an environment, SFT a dataset, evaluation targets).
* **Capabilities** (:func:`joynexus.workflows.compile.compile_workloads`, which the
  Master's tenant creator and ``joynexus spec check`` call): the environment kind is
  registered and runnable here, the dataset exists and matches the schema, the head
  supports the task. Errors list what is allowed.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from joynexus.envs.base import EnvSpec
from joynexus.envs.seeds import (
    EVAL_SEED_BASE,
    TRAIN_SEEDS,
    demo_seeds,
    eval_seeds,
    shared_seeds,
)
from joynexus.errors import SpecError
from joynexus.models.policies import HeadConfig, OFTHeadConfig
from joynexus.models.schema import PRESETS, DataSchema
from joynexus.models.tenant.slots import OptimizerConfig
from joynexus.spec.serving import ServingSpec

_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

#: Experiment trackers a workload's learning curves can go to (each writes offline into
#: the run directory: :mod:`joynexus.metrics.tracking`).
TrackerName = Literal["tensorboard", "wandb", "mlflow", "clearml"]
TRACKERS: tuple[TrackerName, ...] = ("tensorboard", "wandb", "mlflow", "clearml")


def _default_tracking() -> list[TrackerName]:
    return ["tensorboard"]


class TaskKind(StrEnum):
    """What a workload does with its tenant's policy."""

    RL = "rl"
    SFT = "sft"
    EVAL = "eval"
    #: Endpoints only: the server creates the tenant's slot and the tenant drives the
    #: low-level primitives itself (``joynexus serve`` only; ``joynexus run`` refuses it).
    CUSTOM = "custom"


class BaseModelSpec(BaseModel):
    """The resident base model every tenant of a deployment shares."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="Hub id or local path of the backbone.")
    canonical_image_size: int | None = Field(default=None, gt=0, le=1024)
    device: str = "cpu"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    canonicalizer: Literal["tensor", "processor"] = Field(
        default="tensor",
        description="How canonical backbone inputs are made: 'tensor' (batched tensor "
        "ops on the model's device, prompt ids cached) or 'processor' (the Hugging Face "
        "processor per image, the reference; both give the same inputs).",
    )


class DatasetBinding(BaseModel):
    """A LeRobot-format dataset for SFT."""

    model_config = ConfigDict(extra="forbid")

    path: Path
    cameras: dict[str, str] | None = Field(
        default=None, description="Schema camera → dataset feature; inferred when omitted."
    )
    state: str | None = "observation.state"
    action: str = "action"
    normalization: Literal["mean_std", "quantile", "none"] = "mean_std"
    heldout_fraction: float = Field(default=0.1, ge=0, lt=1)
    record_episodes: int = Field(
        default=20,
        ge=1,
        le=100_000,
        description="Episodes `joynexus run` records with the env's scripted expert "
        "when the dataset folder does not exist yet.",
    )
    record_failures: bool = Field(
        default=False,
        description="Also keep the recorded episodes in which the expert failed "
        "(default: successful demonstrations only, as `joynexus data record`).",
    )


#: ``algorithm.kl_coef`` of an RL workload that starts from another policy (init_from).
#: The anchor's gradient on a mean is ``kl_coef·Δμ/σ²`` against the policy gradient's
#: ``E[A·(a − μ)]/σ²`` (advantages normalized to unit scale, ``|a − μ| ≈ σ``): they balance
#: at ``Δμ ≈ c·σ/kl_coef``, ``c`` the advantage–noise correlation (≈ 0.1 on a noisy
#: group). 0.1 lets the mean drift about one exploration std per action entry from the
#: SFT policy before the anchor holds it: room to improve within the region the policy
#: explores, none to walk far from it on a few noisy groups (push-v3's collapse).
DEFAULT_KL_COEF = 0.1


class AlgorithmSpec(BaseModel):
    """Learning algorithm and its hyperparameters."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["sft", "ppo", "grpo", "reinforce"] = "sft"
    gamma: float = Field(default=0.99, ge=0, le=1)
    gae_lambda: float = Field(default=0.95, ge=0, le=1)
    clip_ratio: float = Field(default=0.2, gt=0, lt=1)
    value_coef: float = Field(default=0.5, ge=0)
    entropy_coef: float = Field(default=0.0, ge=0)
    kl_coef: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="rl from init_from only: weight of the KL anchor "
        "KL(policy || reference) added to the loss, the reference being the policy the "
        "workload started from (the SFT checkpoint), frozen; exact for Gaussian and "
        "Flow-SDE heads, in nats per action chunk. Unset: "
        f"{DEFAULT_KL_COEF} with init_from, none without; 0 turns the anchor off.",
    )
    kl_budget: float = Field(
        default=0.0,
        ge=0,
        le=1000,
        description="rl with a KL anchor only: nats per action chunk of KL to the "
        "reference a sample may reach before the anchor acts; the anchor is then "
        "kl_coef * mean(max(0, KL - kl_budget)), so the policy moves freely inside the "
        "budget and is pulled back past it. 0: the anchor acts from the reference on.",
    )
    epochs: int = Field(default=1, ge=1, le=64, description="Passes over each training job.")
    microbatch_size: int = Field(default=64, ge=1, le=65536)
    horizon: int = Field(default=64, ge=1, le=100_000, description="Rollout steps per job.")
    actor_forward: bool = Field(
        default=False, description="Recompute log-probs/values under the actor (App. A.5)."
    )
    samples_per_job: int = Field(
        default=256, ge=1, le=10_000_000, description="SFT samples per training job."
    )
    group_size: int | None = Field(
        default=None,
        ge=2,
        le=1024,
        description="grpo only: the env's sub-envs form groups of this many that start "
        "each rollout from one initial state (seeds of their own, never the evaluation "
        "seeds), and each episode's return is normalized within its group and episode "
        "ordinal (SimpleVLA-RL); env.num_envs must be a multiple. Unset: every sub-env "
        "starts from its own state and all episodes of a rollout form one group.",
    )


#: Checkpoints a tenant keeps unless its spec says otherwise (``scheduling.keep_last``):
#: the latest to resume from and a few before it to go back to.
KEEP_LAST_DEFAULT = 3


class SchedulingSpec(BaseModel):
    """Training Scheduler knobs of this tenant–task policy (App. A.2)."""

    model_config = ConfigDict(extra="forbid")

    # Every integer is bounded: they reach the Training Scheduler's SQLite store.
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    max_in_flight: int | None = Field(default=2, ge=1, le=1_000_000)
    completion_target: int | None = Field(default=10, ge=1, le=1_000_000_000)
    max_policy_staleness: int | None = Field(default=4, ge=0, le=1_000_000_000)
    prefetch: int = Field(default=2, ge=1, le=1024, description="SFT jobs prepared ahead.")
    checkpoint_every: int = Field(
        default=0, ge=0, le=1_000_000_000, description="Updates between checkpoints."
    )
    keep_last: int = Field(
        default=KEEP_LAST_DEFAULT,
        ge=1,
        le=1_000_000,
        description="Checkpoints the tenant keeps: the newest ones; each older one is "
        "deleted once a newer one is written (the checkpoint_every-th ones too), so a "
        "long run's checkpoints take a bounded amount of disk.",
    )


class SeedRange(BaseModel):
    """The seeds ``start``, ``start + 1``, ..., ``start + count - 1``."""

    model_config = ConfigDict(extra="forbid")

    start: int = Field(ge=0, le=2**31 - 1)
    count: int = Field(ge=1, le=10_000)


class EvaluationSpec(BaseModel):
    """A read-only evaluation of other tenants' policies (§4.2 'Evaluation path').

    With ``seeds`` (a list, or ``{start, count}``) every run plays one episode per seed,
    each from a fresh reset with that seed, so two evaluations of one version on the
    same seeds play the same episodes; the seeds are recorded in the metrics and in each
    run's ``eval_info.json``. Without them, ``episodes`` episodes from an unseeded reset.
    """

    model_config = ConfigDict(extra="forbid")

    targets: list[str] = Field(min_length=1)
    episodes: int = Field(default=4, ge=1, le=10_000)
    seeds: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] | SeedRange | None = Field(
        default=None, description="Evaluation seeds: a list or {start, count}."
    )
    interval_s: float = Field(default=10.0, gt=0)
    runs: int = Field(
        default=1, ge=1, le=10_000, description="Evaluation runs before the workload ends."
    )
    deterministic: bool = True
    tasks: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Evaluate every run on each of these tasks of the env kind in turn (a "
        "session each), reporting per-task and overall success with Wilson intervals; "
        "'libero_spatial/*' stands for every task of a LIBERO suite. Default: the env's task.",
    )
    # At most 7: the Environment Service holds a tenant to 8 sessions by default
    # (max_sessions_per_tenant), and the evaluation keeps its own open beside them.
    sessions: int = Field(
        default=1,
        ge=1,
        le=7,
        description="With 'tasks': how many tasks are evaluated at once, each in a session "
        "(a simulator process) of its own; the record keeps the tasks' order.",
    )

    @model_validator(mode="after")
    def _seeds_fit(self) -> EvaluationSpec:
        seeds = self.seed_list()
        if seeds is None:
            return self
        if not 1 <= len(seeds) <= 10_000:
            raise ValueError("evaluation.seeds: give 1 to 10000 seeds")
        if "episodes" in self.model_fields_set and self.episodes != len(seeds):
            raise ValueError(
                f"evaluation.episodes={self.episodes} but evaluation.seeds names {len(seeds)}; "
                "with seeds, each run plays one episode per seed (drop 'episodes')"
            )
        return self

    def seed_list(self) -> list[int] | None:
        """The seeds in order, or None for an unseeded evaluation."""
        if isinstance(self.seeds, SeedRange):
            return list(range(self.seeds.start, self.seeds.start + self.seeds.count))
        return None if self.seeds is None else list(self.seeds)

    @property
    def episodes_per_run(self) -> int:
        seeds = self.seed_list()
        return self.episodes if seeds is None else len(seeds)


class SuccessEvalSpec(BaseModel):
    """The success rate of a trainable tenant, measured before and after its training.

    ``episodes`` episodes in the tenant's ``env`` on fixed seeds ``seed``,
    ``seed + 1``, ...; they must not meet the seeds its demonstrations are recorded
    with. The run summary reports each rate with its Wilson 95 % interval.
    """

    model_config = ConfigDict(extra="forbid")

    episodes: int = Field(default=50, ge=1, le=10_000)
    seed: int = Field(default=EVAL_SEED_BASE, ge=0, le=2**31 - 1)
    deterministic: bool = Field(default=True, description="Policy mean (else sampled actions).")
    initial: bool = Field(default=True, description="Also measure before training starts.")
    initial_episodes: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Episodes of the measurement before training (default: episodes), on "
        "seeds seed, seed + 1, ...: an untrained policy runs every episode to its step "
        "budget, so on a slow simulator fewer before-episodes can say enough.",
    )


class WorkloadSpec(BaseModel):
    """One tenant's workload. See the module docstring."""

    model_config = ConfigDict(extra="forbid")

    api_version: Literal["joynexus/v1"] = "joynexus/v1"
    tenant: str = Field(pattern=_NAME_PATTERN)
    task: TaskKind
    base_model: BaseModelSpec
    schema_: DataSchema | str | None = Field(
        default=None,
        alias="schema",
        description="A DataSchema or a preset name; derived from the env or dataset if omitted.",
    )
    action_module: HeadConfig = Field(default_factory=OFTHeadConfig)
    value_head: bool | None = Field(default=None, description="Defaults to true for ppo.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    env: EnvSpec | None = None
    dataset: DatasetBinding | None = None
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    evaluation: EvaluationSpec | None = None
    init_from: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="Start the policy from another trainable tenant of the run (its last "
        "checkpoint, once its workload ended: RL from SFT) or from a checkpoint directory "
        "('<tenant>/step_<n>'); the action module and normalization are taken, not the "
        "optimizer or version.",
    )
    success_eval: SuccessEvalSpec | None = Field(
        default=None,
        description="Measure the success rate in 'env' before and after training (rl, sft).",
    )
    serving: ServingSpec = Field(
        default_factory=ServingSpec,
        description="How the served policy is reached from outside (openpi websocket keys).",
    )
    output_dir: Path = Field(
        default=Path("runs"),
        description="Deprecated, ignored by `joynexus run` and `serve`: a tenant's "
        "checkpoints and records live in the run directory (`outputs/<tenant>`), next to "
        "the job history they belong to.",
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    tracking: list[TrackerName] = Field(
        default_factory=_default_tracking,
        max_length=len(TRACKERS),
        description="Experiment trackers this tenant's learning curves go to, each offline "
        "in the run directory: tensorboard, wandb (offline), mlflow (file store), clearml "
        "(offline session). `joynexus run/serve --tracking` adds some for every tenant.",
    )

    @model_validator(mode="after")
    def _task_rules(self) -> WorkloadSpec:
        self._check_anchor(self.algorithm.kl_coef)
        if isinstance(self.schema_, str) and self.schema_ not in PRESETS:
            raise ValueError(f"unknown schema preset {self.schema_!r}; presets: {sorted(PRESETS)}")
        if self.task is TaskKind.RL:
            if self.env is None:
                raise ValueError("task 'rl' needs an 'env' (the simulator to collect rollouts in)")
            if self.algorithm.name not in ("ppo", "grpo", "reinforce"):
                raise ValueError(
                    f"task 'rl' needs algorithm.name in ['grpo', 'ppo', 'reinforce'], "
                    f"got {self.algorithm.name!r}"
                )
            # The family refuses what its RL cannot honour (a flow head: Flow-SDE, see
            # models.policies.flow) rather than ignore it.
            self.action_module.check_rl(entropy_coef=self.algorithm.entropy_coef)
        elif self.task is TaskKind.SFT:
            if self.dataset is None:
                raise ValueError("task 'sft' needs a 'dataset' (a LeRobot dataset path)")
            if self.algorithm.name != "sft":
                raise ValueError(
                    f"task 'sft' needs algorithm.name 'sft', got {self.algorithm.name!r}"
                )
        elif self.task is TaskKind.CUSTOM:
            if self.env is None and self.schema_ is None:
                raise ValueError(
                    "task 'custom' needs a 'schema' (or preset) or an 'env' to derive it from"
                )
        else:
            if self.env is None or self.evaluation is None:
                raise ValueError("task 'eval' needs an 'env' and an 'evaluation' with targets")
        if self.evaluation is not None and self.task is not TaskKind.EVAL:
            raise ValueError("'evaluation' belongs to a task 'eval' workload")
        if self.algorithm.group_size is not None:
            self._check_groups(self.algorithm.group_size)
        if self.success_eval is not None:
            self._check_success_eval(self.success_eval)
        if self.init_from is not None:
            if self.task not in (TaskKind.RL, TaskKind.SFT):
                raise ValueError("'init_from' belongs to an rl or sft workload")
            if self.init_from == self.tenant:
                raise ValueError(
                    "'init_from' names this tenant itself; a later workload of a tenant "
                    "resumes from its own checkpoint without it"
                )
        return self

    def _check_anchor(self, kl_coef: float | None) -> None:
        if self.algorithm.kl_budget > 0 and self.anchor_coef() <= 0:
            raise ValueError(
                f"algorithm.kl_budget={self.algorithm.kl_budget} bounds the KL anchor, and "
                "this workload has none (it needs task rl, init_from and kl_coef > 0); "
                "drop kl_budget or set init_from"
            )
        if kl_coef is None:
            return
        if self.task is not TaskKind.RL:
            raise ValueError(
                "algorithm.kl_coef belongs to an rl workload (a KL anchor of RL updates to "
                f"the policy it started from); task {self.task.value!r} has none"
            )
        if kl_coef > 0 and self.init_from is None:
            raise ValueError(
                f"algorithm.kl_coef={kl_coef} anchors the policy to the one it started "
                "from, and this workload starts from a fresh head (no init_from); name "
                "the SFT tenant or checkpoint in init_from, or drop kl_coef"
            )

    def anchor_coef(self) -> float:
        """The KL anchor's weight this workload trains with (see ``kl_coef``)."""
        if self.task is not TaskKind.RL or self.init_from is None:
            return 0.0
        coef = self.algorithm.kl_coef
        return DEFAULT_KL_COEF if coef is None else coef

    def _check_groups(self, group_size: int) -> None:
        name = self.algorithm.name
        if name != "grpo":
            raise ValueError(
                f"algorithm.group_size belongs to grpo (rollouts grouped per initial state, "
                f"returns normalized within each group); {name!r} does not use groups, "
                "remove group_size or set algorithm.name: grpo"
            )
        if self.env is None:
            return
        num_envs = self.env.num_envs
        if num_envs % group_size:
            fits = [d for d in range(2, num_envs + 1) if num_envs % d == 0]
            raise ValueError(
                f"algorithm.group_size={group_size} does not divide env.num_envs={num_envs}: "
                f"each rollout splits the env's {num_envs} sub-envs into groups of "
                f"group_size that share one initial state; set env.num_envs to a multiple of "
                f"{group_size} (e.g. {group_size * max(1, round(num_envs / group_size))}) or "
                f"group_size to a divisor of {num_envs}"
                + (f" ({', '.join(map(str, fits))})" if fits else " (none >= 2: num_envs is 1)")
            )
        if self.success_eval is not None:
            ev = self.success_eval
            if len(shared_seeds(TRAIN_SEEDS, eval_seeds(ev.seed, ev.episodes))):
                raise ValueError(
                    f"success_eval seeds {ev.seed}..{ev.seed + ev.episodes - 1} meet the seeds "
                    f"grouped rollouts train on ({TRAIN_SEEDS.start} and above); move "
                    f"success_eval.seed below {TRAIN_SEEDS.start - ev.episodes + 1}"
                )

    def _check_success_eval(self, ev: SuccessEvalSpec) -> None:
        if self.task not in (TaskKind.RL, TaskKind.SFT):
            raise ValueError("'success_eval' belongs to an rl or sft workload")
        if self.env is None:
            raise ValueError("'success_eval' needs an 'env' (the simulator to measure success in)")
        if self.dataset is None:
            return
        episodes = max(ev.episodes, ev.initial_episodes or 0)
        shared = shared_seeds(
            demo_seeds(self.seed, self.dataset.record_episodes), eval_seeds(ev.seed, episodes)
        )
        if len(shared):
            raise ValueError(
                f"success_eval seeds {ev.seed}..{ev.seed + episodes - 1} meet the seeds the "
                f"demonstrations are recorded with ({self.seed}..."
                f"{self.seed + self.dataset.record_episodes - 1}); move success_eval.seed "
                "(evaluation on training initial states would overstate success)"
            )

    @property
    def uses_value_head(self) -> bool:
        if self.value_head is not None:
            return self.value_head
        return self.task is TaskKind.RL and self.algorithm.name == "ppo"

    def resolved_schema(self) -> DataSchema | None:
        """The declared schema (preset resolved), or None when it comes from env/dataset."""
        if isinstance(self.schema_, str):
            return PRESETS[self.schema_]
        return self.schema_


def _format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid workload spec {source}:"]
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        lines.append(f"  {where}: {item['msg']}")
    return "\n".join(lines)


def parse_spec(data: Any, *, source: str = "<data>") -> WorkloadSpec:
    """Validate one spec given as a mapping.

    Raises:
        SpecError: listing every offending field and what is allowed.
    """
    if not isinstance(data, dict):
        raise SpecError(f"invalid workload spec {source}: expected a mapping at the top level")
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as error:
        raise SpecError(_format_validation_error(error, source), source=source) from None


def load_specs(path: str | Path) -> list[WorkloadSpec]:
    """Load one YAML file holding one spec, a list of specs, or ``{workloads: [...]}``.

    Relative dataset paths and output dirs are resolved against the file's folder, so a
    spec file works from any current directory.

    Raises:
        SpecError: when the file is missing, is not YAML, or a spec does not validate.
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"workload spec file not found: {path}", source=str(path)) from None
    except yaml.YAMLError as error:
        raise SpecError(f"{path} is not valid YAML: {error}", source=str(path)) from None
    items = raw.get("workloads") if isinstance(raw, dict) and "workloads" in raw else raw
    if not isinstance(items, list):
        items = [items]
    specs = [parse_spec(item, source=f"{path}[{i}]") for i, item in enumerate(items)]
    base = path.resolve().parent
    resolved: list[WorkloadSpec] = []
    for spec in specs:
        update: dict[str, Any] = {}
        if not spec.output_dir.is_absolute():
            update["output_dir"] = base / spec.output_dir
        if spec.dataset is not None and not spec.dataset.path.is_absolute():
            update["dataset"] = spec.dataset.model_copy(update={"path": base / spec.dataset.path})
        # init_from names a tenant of the file, or else a checkpoint path.
        src = spec.init_from
        if src is not None and src not in {s.tenant for s in specs} and not Path(src).is_absolute():
            update["init_from"] = str(base / src)
        resolved.append(spec.model_copy(update=update))
    tenants = [s.tenant for s in resolved]
    duplicates = sorted({t for t in tenants if tenants.count(t) > 1})
    if duplicates:
        raise SpecError(f"{path}: tenant names must be unique, repeated: {duplicates}")
    return resolved


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema of workload specs (``joynexus spec schema``)."""
    return WorkloadSpec.model_json_schema(by_alias=True)
