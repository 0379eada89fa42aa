"""The §5.1 workload mixture at demo scale: 3 RL tenants + 1 SFT tenant + 1 evaluation.

Three environment profiles:

* ``paper`` — the paper's own simulators: LIBERO (``libero_spatial/0`` from the asset
  pack) and two ManiSkill3 configurations (PickCube, PushCube), 64 px, fast rendering.
* ``fast`` — faster simulators for a small budget: PushT, MetaWorld reach and reach2d.
* ``test`` — three reach2d tenants and a tiny PushT recording (the test suite's scale).

Every profile keeps the paper's knobs: at most 2 outstanding training jobs per RL tenant,
at most 1 active rollout per tenant and 3 globally (the compiler's global limit), RL
priority above SFT at the actor, a bounded SFT prefetch, and a staleness bound.
The SFT tenant trains on scripted-expert demonstrations recorded at demo start when
missing (MetaWorld reach for ``paper``/``fast``, PushT for ``test``), and the evaluation
declaration reads the SFT tenant's published policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from joynexus.errors import SpecError
from joynexus.spec.workload import WorkloadSpec

__all__ = [
    "PROFILES",
    "DemoMixture",
    "Profile",
    "build_mixture",
    "choose_profile",
]

Profile = Literal["paper", "fast", "test"]
PROFILES: tuple[Profile, ...] = ("paper", "fast", "test")

BASE_MODEL = "tiny:qwen2_5_vl"
#: RL updates outrank SFT at the actor (the scheduler leases higher priority first).
RL_PRIORITY = 1
SFT_PRIORITY = 0
MAX_IN_FLIGHT_RL = 2
SFT_PREFETCH = 16
MAX_POLICY_STALENESS = 4
#: The SFT tenant's completion target is only a cap: it fills the actor's idle time until
#: the RL tenants finish, when the demo closes its admission (§5.1: it "continuously
#: submits" batches).
SFT_MAX_JOBS = 10_000

#: Below this budget the paper profile cannot finish its matched work plus the isolated
#: replays on a 2-core CPU (measured: LIBERO ≈ 33 and ManiSkill3 ≈ 14–23 steps/s at 64 px
#: with fast rendering when the machine is otherwise idle; each session also takes
#: 5–9 s to start, once per phase).
PAPER_MIN_MINUTES = 8.0


@dataclass(frozen=True)
class _RLEnv:
    tenant: str
    env: dict[str, Any]
    horizon: int
    num_envs: int = 1


@dataclass(frozen=True)
class _ProfileDef:
    rl: tuple[_RLEnv, ...]
    sft_env: dict[str, Any]
    sft_dataset: str
    record_episodes: int
    sft_samples_per_job: int
    # RL updates per tenant per budget minute (measured to fit the budget).
    rl_updates_per_minute: float
    eval_interval_s: float
    reason: str


_IMAGE = 64
_PROFILES: dict[Profile, _ProfileDef] = {
    "paper": _ProfileDef(
        rl=(
            _RLEnv(
                "rl-libero",
                {
                    "kind": "libero",
                    "task": "libero_spatial/0",
                    "image_size": _IMAGE,
                    "max_episode_steps": 96,
                },
                horizon=12,
            ),
            _RLEnv(
                "rl-pickcube",
                {
                    "kind": "maniskill",
                    "task": "PickCube-v1",
                    "image_size": _IMAGE,
                    "max_episode_steps": 64,
                },
                horizon=8,
            ),
            _RLEnv(
                "rl-pushcube",
                {
                    "kind": "maniskill",
                    "task": "PushCube-v1",
                    "image_size": _IMAGE,
                    "max_episode_steps": 64,
                },
                horizon=8,
            ),
        ),
        sft_env={
            "kind": "metaworld",
            "task": "reach-v3",
            "image_size": _IMAGE,
            "max_episode_steps": 80,
        },
        sft_dataset="metaworld-reach-64",
        record_episodes=10,
        sft_samples_per_job=64,
        rl_updates_per_minute=1.0,
        eval_interval_s=20.0,
        reason=(
            "the paper's simulators (LIBERO + two ManiSkill3 configurations) fit the "
            f"budget (≥ {PAPER_MIN_MINUTES:g} min) at 64 px with fast rendering"
        ),
    ),
    "fast": _ProfileDef(
        rl=(
            _RLEnv(
                "rl-pusht",
                {"kind": "pusht", "image_size": _IMAGE, "max_episode_steps": 96},
                horizon=12,
            ),
            _RLEnv(
                "rl-metaworld",
                {
                    "kind": "metaworld",
                    "task": "reach-v3",
                    "image_size": _IMAGE,
                    "max_episode_steps": 64,
                },
                horizon=16,
            ),
            _RLEnv("rl-reach2d", {"kind": "reach2d", "image_size": _IMAGE}, horizon=30, num_envs=4),
        ),
        sft_env={
            "kind": "metaworld",
            "task": "reach-v3",
            "image_size": _IMAGE,
            "max_episode_steps": 80,
        },
        sft_dataset="metaworld-reach-64",
        record_episodes=10,
        sft_samples_per_job=64,
        rl_updates_per_minute=3.0,
        eval_interval_s=20.0,
        reason=(
            f"the budget is under {PAPER_MIN_MINUTES:g} min, too short for LIBERO and "
            "ManiSkill3 on this CPU; PushT, MetaWorld and reach2d step 3-100x faster"
        ),
    ),
    "test": _ProfileDef(
        rl=tuple(
            _RLEnv(f"rl-reach{i}", {"kind": "reach2d", "image_size": 32}, horizon=8, num_envs=2)
            for i in range(3)
        ),
        sft_env={"kind": "pusht", "image_size": 32, "max_episode_steps": 12},
        sft_dataset="pusht-32-test",
        record_episodes=2,
        sft_samples_per_job=16,
        rl_updates_per_minute=2.0,
        eval_interval_s=1.0,
        reason="test scale: reach2d tenants and a tiny PushT recording",
    ),
}


@dataclass(frozen=True)
class DemoMixture:
    """The demo's workload specs and the choice behind them.

    Attributes:
        profile: Which environment profile was chosen.
        reason: Why (printed and written to the report).
        specs: 3 RL specs, 1 SFT spec and 1 evaluation spec, in that order.
        rl_tenants / sft_tenant / eval_tenant: Their tenant ids.
    """

    profile: Profile
    reason: str
    specs: list[WorkloadSpec]
    rl_tenants: list[str]
    sft_tenant: str
    eval_tenant: str

    @property
    def training_specs(self) -> list[WorkloadSpec]:
        """The specs that create training jobs (replayed in the isolated baseline)."""
        return [s for s in self.specs if s.tenant != self.eval_tenant]

    def knobs(self) -> dict[str, Any]:
        """The §5.1 scheduling knobs this mixture uses (for the report)."""
        return {
            "max_in_flight_per_rl_tenant": MAX_IN_FLIGHT_RL,
            "max_active_rollouts_per_tenant": 1,
            "max_active_rollouts_global": 3,
            "rl_priority": RL_PRIORITY,
            "sft_priority": SFT_PRIORITY,
            "sft_prefetch": SFT_PREFETCH,
            "max_policy_staleness": MAX_POLICY_STALENESS,
        }


def choose_profile(minutes: float) -> tuple[Profile, str]:
    """The paper's simulators when the budget allows them, else the fast ones."""
    profile: Profile = "paper" if minutes >= PAPER_MIN_MINUTES else "fast"
    return profile, _PROFILES[profile].reason


def build_mixture(
    out_dir: Path,
    *,
    minutes: float = 10.0,
    profile: Profile | None = None,
    data_dir: Path | None = None,
    rl_updates: int | None = None,
    sft_jobs: int | None = None,
) -> DemoMixture:
    """Build the demo's specs.

    Args:
        out_dir: Root of the tenants' outputs.
        minutes: Budget of the whole demo (multi-tenant run plus isolated replays); the
            completion targets scale with it.
        profile: Force an environment profile (default: :func:`choose_profile`).
        data_dir: Where the SFT demonstrations live or are recorded (default
            ``<out_dir>/data``).
        rl_updates: Override the RL tenants' completion target.
        sft_jobs: Cap the SFT tenant's jobs (default :data:`SFT_MAX_JOBS`).

    Raises:
        SpecError: an unknown profile or a non-positive budget.
    """
    if minutes <= 0:
        raise SpecError(f"minutes must be > 0, got {minutes}", field="minutes")
    if profile is None:
        profile, reason = choose_profile(minutes)
    elif profile not in _PROFILES:
        raise SpecError(f"unknown demo profile {profile!r}; allowed {list(PROFILES)}")
    else:
        reason = _PROFILES[profile].reason
    p = _PROFILES[profile]
    n_rl = (
        rl_updates
        if rl_updates is not None
        else max(2, math.floor(p.rl_updates_per_minute * minutes))
    )
    n_sft = sft_jobs if sft_jobs is not None else SFT_MAX_JOBS
    base = {"id": BASE_MODEL}
    head = {"type": "oft", "hidden_dim": 64, "num_blocks": 1}
    data = (data_dir or out_dir / "data") / p.sft_dataset
    specs: list[WorkloadSpec] = []
    for i, rl in enumerate(p.rl):
        env = dict(rl.env) | {"num_envs": rl.num_envs}
        samples = rl.num_envs * rl.horizon
        specs.append(
            WorkloadSpec.model_validate(
                {
                    "tenant": rl.tenant,
                    "task": "rl",
                    "base_model": base,
                    "env": env,
                    "action_module": head,
                    "optimizer": {"lr": 1e-3},
                    "algorithm": {
                        "name": "ppo",
                        "horizon": rl.horizon,
                        "microbatch_size": samples,
                        "epochs": 2,
                    },
                    "scheduling": {
                        "priority": RL_PRIORITY,
                        "max_in_flight": MAX_IN_FLIGHT_RL,
                        "completion_target": n_rl,
                        "max_policy_staleness": MAX_POLICY_STALENESS,
                    },
                    "output_dir": str(out_dir),
                    "seed": i,
                }
            )
        )
    sft_tenant = "sft-demos"
    specs.append(
        WorkloadSpec.model_validate(
            {
                "tenant": sft_tenant,
                "task": "sft",
                "base_model": base,
                "env": p.sft_env,
                "dataset": {
                    "path": str(data),
                    "record_episodes": p.record_episodes,
                    "heldout_fraction": 0.2,
                },
                "action_module": head,
                "optimizer": {"lr": 1e-3},
                "algorithm": {
                    "name": "sft",
                    "samples_per_job": p.sft_samples_per_job,
                    "microbatch_size": p.sft_samples_per_job,
                },
                "scheduling": {
                    "priority": SFT_PRIORITY,
                    "max_in_flight": SFT_PREFETCH,
                    "prefetch": SFT_PREFETCH,
                    "completion_target": n_sft,
                },
                "output_dir": str(out_dir),
            }
        )
    )
    eval_tenant = "eval-sft"
    specs.append(
        WorkloadSpec.model_validate(
            {
                "tenant": eval_tenant,
                "task": "eval",
                "base_model": base,
                "env": p.sft_env,
                "evaluation": {
                    "targets": [sft_tenant],
                    "episodes": 2,
                    "interval_s": p.eval_interval_s,
                    "runs": 1,
                },
                "output_dir": str(out_dir),
            }
        )
    )
    return DemoMixture(
        profile=profile,
        reason=reason,
        specs=specs,
        rl_tenants=[rl.tenant for rl in p.rl],
        sft_tenant=sft_tenant,
        eval_tenant=eval_tenant,
    )
