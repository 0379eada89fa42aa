"""Scenarios of the trace simulator: pydantic models, the built-in presets, YAML I/O.

A scenario describes one *node* — its GPU layout, environment pools, the durations of
the simulated services and the tenant mix — and how many nodes (``scale``) and copies
of the tenant mix per node (``tenant_copies``) to run. :func:`expand` turns it into a
flat :class:`Deployment` (every tenant, pool and actor replica with a unique name),
which is what :mod:`joynexus.sim.model` runs.

The ``paper-5.1`` preset follows §5.1 of the paper: one 8-GPU node with a 2–2–4
layout (actor–inference–environment), three RL tenants (a LIBERO-like one and two
ManiSkill-like ones) plus one SFT tenant, global actor microbatch 256 (128 per GPU),
inference cap 128, ≤ 2 outstanding jobs per RL tenant, ≤ 1 active rollout per tenant
and 3 globally, RL priority over SFT, SFT prefetch bound 16, staleness bound 128 and a
90-minute matched window. The isolated baseline is the 1–1–2 layout.

The *durations* are our own assumptions (the paper does not publish them); they are
chosen from first principles for a ~4B VLM on datacenter GPUs, not fitted to the
paper's results:

* inference: a batch of ``n`` samples takes ``base_s + per_sample_s · n``
  (0.05 s + 4 ms/sample: ~0.56 s for a full 128-sample batch of one image each);
* actor: 0.8 s per microbatch of 128 samples per GPU (frozen backbone forward plus
  the tenant head's forward/backward); with fewer actor GPUs the same per-GPU
  microbatch means more optimizer steps per job;
* LIBERO-like: 64 envs, 64 action chunks per rollout, 1.0 s per chunk; ManiSkill-like:
  128 envs, 50 and 80 chunks at 1.2 s and 1.8 s per chunk — simulation dominates a
  rollout, as the paper observes in its standalone traces ("the actor is idle during
  long simulator interactions"); each step gets ±10 % seeded jitter;
* environment pools shared by several tenants slow each step down by
  ``1 + contention · (other tenants stepping in that pool)``;
* the advantage stage takes 2 s and uses no model-service GPU;
* the SFT dataloader builds one 512-sample batch every 10 s (video decoding), so SFT
  alone cannot saturate the actor (the paper's multi-tenant actor is not saturated
  either).

``scale-64`` runs 64 tenants on 64 GPUs: 8 such nodes, each hosting two copies of the
tenant mix (6 RL + 2 SFT), with one scheduler and one inference pool shared by all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from joynexus.errors import SpecError

# Reference figures of the paper's §5.1 (printed next to ours, never used in a formula).
PAPER_REFERENCE: dict[str, float] = {
    "device_time_ratio": 1.39,
    "device_time_reduction": 0.283,
    "isolated_training_utilization": 0.208,
    "multi_tenant_training_utilization": 0.413,
    "isolated_inference_utilization": 0.281,
    "multi_tenant_inference_utilization": 0.375,
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Layout(_Model):
    """GPUs of one deployment unit: actor (training), inference, environment."""

    actor_gpus: int = Field(ge=1)
    inference_gpus: int = Field(ge=1)
    env_gpus: int = Field(ge=0)

    @property
    def total_gpus(self) -> int:
        return self.actor_gpus + self.inference_gpus + self.env_gpus


class EnvPool(_Model):
    """A group of environment GPUs; tenants placed on it contend for it."""

    name: str
    gpus: int = Field(ge=1)
    contention: float = Field(
        default=0.5,
        ge=0.0,
        description="Step slowdown per other tenant stepping in this pool at the same time.",
    )


class ActorConfig(_Model):
    """The Training Model Service actor (data-parallel over its GPUs)."""

    per_gpu_microbatch: int = Field(default=128, ge=1)
    time_per_microbatch_s: float = Field(default=0.8, gt=0)


class InferenceConfig(_Model):
    """The Inference Model Service with group batching (max wait T, cap B)."""

    max_batch_samples: int = Field(default=128, ge=1)
    max_wait_s: float = Field(default=0.02, ge=0)
    base_s: float = Field(default=0.05, ge=0)
    per_sample_s: float = Field(default=0.004, ge=0)

    def batch_time(self, samples: int) -> float:
        """Busy time of one physical batch (an oversized request runs as several)."""
        chunks = max(1, -(-samples // self.max_batch_samples))
        return chunks * self.base_s + self.per_sample_s * samples


class SchedulerKnobs(_Model):
    """Admission and consistency knobs handed to the real Training Scheduler."""

    rl_priority: int = 10
    sft_priority: int = 0
    rl_max_in_flight: int = Field(default=2, ge=1)
    max_active_rollouts: int = Field(default=3, ge=1, description="Per node.")
    max_active_rollouts_per_tenant: int = Field(default=1, ge=1)
    sft_max_in_flight: int = Field(default=16, ge=1)
    staleness_bound: int = Field(default=128, ge=0)
    lease_ttl_s: float = Field(default=900.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)


class RLTenant(_Model):
    """An online RL tenant: rollouts of ``horizon`` chunks over ``num_envs`` envs."""

    tenant_id: str
    env: str = Field(description="Simulator it stands for (label only).")
    pool: str
    num_envs: int = Field(ge=1)
    horizon: int = Field(ge=1)
    env_step_s: float = Field(gt=0)
    step_jitter: float = Field(default=0.1, ge=0, lt=1)
    advantage_s: float = Field(default=2.0, ge=0)

    @property
    def sample_count(self) -> int:
        return self.num_envs * self.horizon


class SFTTenant(_Model):
    """An offline SFT tenant whose dataloader builds batches at a bounded rate."""

    tenant_id: str
    samples_per_batch: int = Field(ge=1)
    load_s: float = Field(default=10.0, ge=0)


class Scenario(_Model):
    """A simulation scenario; see the module docstring."""

    name: str
    description: str = ""
    seed: int = 0
    window_s: float = Field(gt=0, description="Matched window of the multi-tenant run.")
    scale: int = Field(default=1, ge=1, description="Number of nodes.")
    tenant_copies: int = Field(default=1, ge=1, description="Copies of the tenant mix per node.")
    multi_tenant: Layout
    isolated: Layout
    env_pools: list[EnvPool]
    actor: ActorConfig = ActorConfig()
    inference: InferenceConfig = InferenceConfig()
    scheduler: SchedulerKnobs = SchedulerKnobs()
    rl_tenants: list[RLTenant]
    sft_tenants: list[SFTTenant] = []

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        pools = [p.name for p in self.env_pools]
        if len(set(pools)) != len(pools):
            raise ValueError(f"env_pools names must be unique, got {pools}")
        pool_gpus = sum(p.gpus for p in self.env_pools)
        if pool_gpus != self.multi_tenant.env_gpus:
            raise ValueError(
                f"env_pools hold {pool_gpus} GPUs but multi_tenant.env_gpus is "
                f"{self.multi_tenant.env_gpus}; they must match"
            )
        ids = [t.tenant_id for t in self.rl_tenants] + [t.tenant_id for t in self.sft_tenants]
        if len(set(ids)) != len(ids):
            raise ValueError(f"tenant ids must be unique, got {ids}")
        if not self.rl_tenants:
            raise ValueError("a scenario needs at least one RL tenant (rl_tenants is empty)")
        for t in self.rl_tenants:
            if t.pool not in pools:
                raise ValueError(
                    f"RL tenant {t.tenant_id!r} names pool {t.pool!r}; allowed: {pools}"
                )
        # Workers heartbeat between uninterrupted stages (every quarter TTL at most), so
        # no single stage may come near the lease TTL or a healthy lease would expire.
        sharers = max((sum(1 for t in self.rl_tenants if t.pool == p) for p in pools), default=1)
        worst_slowdown = 1 + max((p.contention for p in self.env_pools), default=0.0) * sharers
        stages = {
            "actor.time_per_microbatch_s": self.actor.time_per_microbatch_s,
            **{f"sft {t.tenant_id}: load_s": t.load_s for t in self.sft_tenants},
            **{f"rl {t.tenant_id}: advantage_s": t.advantage_s for t in self.rl_tenants},
            **{
                f"rl {t.tenant_id}: env step (with jitter and pool contention)": t.env_step_s
                * (1 + t.step_jitter)
                * worst_slowdown
                + self.inference.batch_time(t.num_envs)
                for t in self.rl_tenants
            },
        }
        name, longest = max(stages.items(), key=lambda kv: kv[1])
        if longest * 2 > self.scheduler.lease_ttl_s:
            raise ValueError(
                f"scheduler.lease_ttl_s ({self.scheduler.lease_ttl_s} s) must be more than "
                f"twice the longest uninterrupted stage, {name} ({longest:.1f} s)"
            )
        return self


# ----------------------------------------------------------------------- presets


def _paper_5_1() -> Scenario:
    return Scenario(
        name="paper-5.1",
        description=(
            "Paper §5.1: 8 GPUs (2-2-4) shared by 3 RL tenants (LIBERO-like, two "
            "ManiSkill-like) and 1 SFT tenant, vs. each alone on 1-1-2."
        ),
        window_s=90 * 60.0,
        multi_tenant=Layout(actor_gpus=2, inference_gpus=2, env_gpus=4),
        isolated=Layout(actor_gpus=1, inference_gpus=1, env_gpus=2),
        env_pools=[
            EnvPool(name="pool-1", gpus=2, contention=0.5),
            EnvPool(name="pool-2", gpus=2, contention=0.5),
        ],
        rl_tenants=[
            RLTenant(
                tenant_id="libero", env="LIBERO", pool="pool-1",
                num_envs=64, horizon=64, env_step_s=1.0,
            ),
            RLTenant(
                tenant_id="maniskill-1", env="ManiSkill3", pool="pool-1",
                num_envs=128, horizon=50, env_step_s=1.2,
            ),
            RLTenant(
                tenant_id="maniskill-2", env="ManiSkill3", pool="pool-2",
                num_envs=128, horizon=80, env_step_s=1.8,
            ),
        ],
        sft_tenants=[SFTTenant(tenant_id="sft", samples_per_batch=512, load_s=10.0)],
    )  # fmt: skip


def _scale_64() -> Scenario:
    base = _paper_5_1()
    return base.model_copy(
        update={
            "name": "scale-64",
            "description": (
                "64 tenants on 64 GPUs: 8 nodes of the paper-5.1 layout, each hosting two "
                "copies of its tenant mix (6 RL + 2 SFT), one shared scheduler and "
                "inference pool; a 30-minute window."
            ),
            "window_s": 30 * 60.0,
            "scale": 8,
            "tenant_copies": 2,
            "scheduler": base.scheduler.model_copy(update={"max_active_rollouts": 6}),
        }
    )


PRESETS: dict[str, Any] = {"paper-5.1": _paper_5_1, "scale-64": _scale_64}


def preset(name: str) -> Scenario:
    """A built-in scenario by name.

    Raises:
        SpecError: unknown name (the message lists the presets).
    """
    factory = PRESETS.get(name)
    if factory is None:
        raise SpecError(
            f"unknown scenario preset {name!r}; presets: {', '.join(sorted(PRESETS))}",
            field="scenario",
            allowed=sorted(PRESETS),
        )
    scenario: Scenario = factory()
    return scenario


def load_scenario(source: str | Path) -> Scenario:
    """A preset name or a YAML file path.

    Raises:
        SpecError: the file is missing, not YAML, or does not validate (the message
            names the offending fields).
    """
    if isinstance(source, str) and source in PRESETS:
        return preset(source)
    path = Path(source)
    if not path.is_file():
        raise SpecError(
            f"scenario {str(source)!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
            "nor an existing YAML file",
            field="scenario",
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"scenario file {path} is not valid YAML: {exc}") from None
    return scenario_from_dict(data, origin=str(path))


def scenario_from_dict(data: Any, origin: str = "<dict>") -> Scenario:
    """Validate a mapping as a :class:`Scenario`. Raises SpecError on invalid input."""
    if not isinstance(data, dict):
        raise SpecError(f"scenario {origin} must be a mapping, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SpecError(f"invalid scenario {origin}: {problems}") from None


def scenario_to_yaml(scenario: Scenario) -> str:
    """The scenario as YAML (round-trips through :func:`scenario_from_dict`)."""
    return yaml.safe_dump(
        scenario.model_dump(mode="json"), sort_keys=False, allow_unicode=True, width=100
    )


# -------------------------------------------------------------------- deployment


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    contention: float


@dataclass(frozen=True, slots=True)
class RLSpec:
    tenant: RLTenant  # with a unique tenant_id and its expanded pool name
    actor: str  # consumer role of the actor replica that owns this tenant


@dataclass(frozen=True, slots=True)
class SFTSpec:
    tenant: SFTTenant
    actor: str


@dataclass(frozen=True, slots=True)
class Deployment:
    """Everything one simulation run needs, already expanded to unique names."""

    layout: Layout  # per actor replica / node
    replicas: tuple[str, ...]  # actor consumer roles, one per node
    inference_gpus: int
    pools: tuple[PoolSpec, ...]
    rl: tuple[RLSpec, ...]
    sft: tuple[SFTSpec, ...]
    max_active_rollouts: int

    @property
    def total_gpus(self) -> int:
        return self.layout.total_gpus * len(self.replicas)


def _suffix(scenario: Scenario, node: int, copy: int) -> str:
    parts = []
    if scenario.scale > 1:
        parts.append(f"n{node}")
    if scenario.tenant_copies > 1:
        parts.append(f"c{copy}")
    return ("-" + "-".join(parts)) if parts else ""


def expand(scenario: Scenario) -> Deployment:
    """The multi-tenant deployment: ``scale`` nodes × ``tenant_copies`` tenant mixes."""
    replicas: list[str] = []
    pools: list[PoolSpec] = []
    rl: list[RLSpec] = []
    sft: list[SFTSpec] = []
    for node in range(scenario.scale):
        role = "actor" if scenario.scale == 1 else f"actor-n{node}"
        replicas.append(role)
        node_sfx = f"-n{node}" if scenario.scale > 1 else ""
        pools.extend(PoolSpec(p.name + node_sfx, p.contention) for p in scenario.env_pools)
        for copy in range(scenario.tenant_copies):
            sfx = _suffix(scenario, node, copy)
            for t in scenario.rl_tenants:
                renamed = t.model_copy(
                    update={"tenant_id": t.tenant_id + sfx, "pool": t.pool + node_sfx}
                )
                rl.append(RLSpec(renamed, role))
            for s in scenario.sft_tenants:
                sft.append(SFTSpec(s.model_copy(update={"tenant_id": s.tenant_id + sfx}), role))
    return Deployment(
        layout=scenario.multi_tenant,
        replicas=tuple(replicas),
        inference_gpus=scenario.multi_tenant.inference_gpus * scenario.scale,
        pools=tuple(pools),
        rl=tuple(rl),
        sft=tuple(sft),
        max_active_rollouts=scenario.scheduler.max_active_rollouts * scenario.scale,
    )


def isolated_rl(scenario: Scenario, spec: RLSpec) -> Deployment:
    """One RL tenant alone on the isolated layout, on its own environment pool."""
    pool = PoolSpec(f"{spec.tenant.tenant_id}-pool", 0.0)
    tenant = spec.tenant.model_copy(update={"pool": pool.name})
    return Deployment(
        layout=scenario.isolated,
        replicas=("actor",),
        inference_gpus=scenario.isolated.inference_gpus,
        pools=(pool,),
        rl=(RLSpec(tenant, "actor"),),
        sft=(),
        max_active_rollouts=scenario.scheduler.max_active_rollouts,
    )


def isolated_sft(scenario: Scenario, spec: SFTSpec) -> Deployment:
    """One SFT tenant's work appended alone on the isolated layout."""
    return Deployment(
        layout=scenario.isolated,
        replicas=("actor",),
        inference_gpus=scenario.isolated.inference_gpus,
        pools=(),
        rl=(),
        sft=(SFTSpec(spec.tenant, "actor"),),
        max_active_rollouts=scenario.scheduler.max_active_rollouts,
    )
