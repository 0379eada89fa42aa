"""The §5.1 workload mixture at demo scale: 3 RL tenants + 1 SFT tenant + 1 evaluation.

Three environment profiles:

* ``paper`` — the paper's own simulators: LIBERO (``libero_spatial/0``, scene assets from
  the registry packages the install brings) and two ManiSkill3 configurations
  (PickCube, PushCube), 64 px, fast rendering.
* ``fast`` — faster simulators for a small budget: PushT, MetaWorld reach and reach2d.
* ``test`` — three reach2d tenants and a tiny PushT recording (the test suite's scale).

Before anything starts, :func:`choose_envs` checks what each simulator of the wanted
profile needs here (:mod:`joynexus.demo.envcheck`: assets, renderers): the paper
profile falls back to the fast one, saying why, when one of its simulators cannot run
(LIBERO's assets missing, a renderer that does not start); a profile forced with
``--envs`` that cannot run stops the demo at once with one line that says what to install or set.

Every profile keeps the paper's knobs: at most 2 outstanding training jobs per RL tenant,
at most 1 active rollout per tenant and 3 globally (the compiler's global limit), RL
priority above SFT at the actor, a bounded SFT prefetch, and a staleness bound.
The SFT tenant trains on scripted-expert demonstrations recorded at demo start when
missing (MetaWorld reach for ``paper``/``fast``, PushT for ``test``), and the evaluation
declaration reads the SFT tenant's published policy.

Every trainable tenant (the RL tenants and the SFT tenant) declares a ``success_eval``
of its profile's :data:`SUCCESS_EPISODES` episodes unless told otherwise (``joynexus
demo --success-episodes N``; 0 leaves it out): its success rate is measured in its own
simulator before its first update and after its last, on the fixed evaluation seeds
:data:`~joynexus.envs.seeds.EVAL_SEED_BASE` + j, which never meet the seeds the SFT
demonstrations are recorded with (``seed`` + k, k < ``record_episodes``; the spec
checks it). The isolated replays measure it, where both measurements fall outside the
replay's window; the multi-tenant run submits the specs without it
(:attr:`DemoMixture.multi_tenant_specs`), since there a tenant's measurement would
delay its start and overlap the other tenants' work.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from joynexus.envs.base import EnvSpec
from joynexus.envs.seeds import EVAL_SEED_BASE
from joynexus.errors import SpecError
from joynexus.spec.workload import WorkloadSpec

__all__ = [
    "PROFILES",
    "SFT_SUCCESS_EPISODES",
    "SUCCESS_EPISODES",
    "DemoMixture",
    "EnvCheck",
    "EnvChoice",
    "Profile",
    "build_mixture",
    "choose_envs",
    "choose_profile",
    "profile_env_specs",
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


#: Episodes of each trainable tenant's success measurement (before and after training,
#: in its isolated replay, one measurement after another) unless ``--success-episodes``
#: says otherwise. An untrained policy runs every episode to its step limit; measured on
#: a 2-core CPU shared with other work, one episode took ≈ 12 s in LIBERO, ≈ 6 s in
#: ManiSkill3, ≈ 2 s in MetaWorld, ≈ 1.3 s in PushT and ≈ 0.3 s in reach2d (4 sub-envs
#: at once), so each episode of the default adds ≈ 50 s to the paper profile's demo and
#: ≈ 10 s to the fast one's (measured: 10 episodes added ≈ 100 s to the fast profile's
#: isolated replays, 6 episodes ≈ 55 s). The defaults keep that under about a minute and
#: a half; few episodes give wide Wilson intervals, so raise it when there is time.
SUCCESS_EPISODES: dict[Profile, int] = {"paper": 2, "fast": 6, "test": 2}

#: Episodes of the SFT tenant's success measurement unless ``--success-episodes`` says
#: otherwise: the one tenant whose rise this budget can tell apart (SFT on successful
#: expert demonstrations lifts MetaWorld reach-v3 well above the untrained head's rate,
#: while a few PPO updates of a tiny head from scratch do not make the RL tenants
#: succeed), so it gets enough episodes for Wilson intervals that can separate.
#: Measured (docs/RESULTS.md §15.3, the tenant alone with 200 SFT jobs, fewer than its
#: matched work in a 10-minute demo): 10 % [4, 23] → 90 % [77, 96] on 40 episodes, the
#: final measurement ≈ 60 s on a loaded 2-core CPU; 30 keeps the intervals apart at
#: these rates (3/30 → [3, 26], 27/30 → [74, 97]) for ≈ 75 % of the time.
SFT_SUCCESS_EPISODES: dict[Profile, int] = {"paper": 30, "fast": 30, "test": 2}


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
    # Record the expert's failed episodes too (the test scale's 12-step PushT episodes
    # never finish); the other profiles train on successful demonstrations only.
    record_failures: bool
    sft_samples_per_job: int
    # Rows of one SFT optimizer step; a job of several microbatches makes as many
    # updates, and its lease, durable checkpoint and publication are paid once.
    sft_microbatch_size: int
    # RL updates per tenant per budget minute (measured to fit the budget).
    rl_updates_per_minute: float
    eval_interval_s: float
    description: str


_IMAGE = 64
# The SFT tenant's steps are 64 rows; a job is 4 of them. Each job's host work (lease,
# the Master's durable checkpoint, publishing for the evaluation tenant, completing it;
# about 8 ms) idled the device between 55 ms steps when every job was one step: 19 s of
# a 162 s multi-tenant window (RESULTS §1.2).
_SFT_MICROBATCH = 64
_SFT_JOB = 4 * _SFT_MICROBATCH
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
        sft_dataset="metaworld-reach-64-ok30",
        record_episodes=30,
        record_failures=False,
        sft_samples_per_job=_SFT_JOB,
        sft_microbatch_size=_SFT_MICROBATCH,
        rl_updates_per_minute=1.0,
        eval_interval_s=20.0,
        description=(
            "the paper's simulators: LIBERO libero_spatial/0 and ManiSkill3 PickCube-v1 and "
            "PushCube-v1 for RL, MetaWorld reach-v3 demonstrations for SFT, 64 px, fast "
            "rendering"
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
        sft_dataset="metaworld-reach-64-ok30",
        record_episodes=30,
        record_failures=False,
        sft_samples_per_job=_SFT_JOB,
        sft_microbatch_size=_SFT_MICROBATCH,
        rl_updates_per_minute=3.0,
        eval_interval_s=20.0,
        description=(
            "the fast simulators: PushT, MetaWorld reach-v3 and reach2d for RL (3-100x the "
            "steps/s of LIBERO and ManiSkill3 on a CPU), MetaWorld reach-v3 demonstrations "
            "for SFT"
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
        record_failures=True,
        sft_samples_per_job=16,
        sft_microbatch_size=16,
        rl_updates_per_minute=2.0,
        eval_interval_s=1.0,
        description="test scale: three reach2d RL tenants and a tiny PushT recording for SFT",
    ),
}


@dataclass(frozen=True)
class DemoMixture:
    """The demo's workload specs and the choice behind them.

    Attributes:
        profile: Which environment profile was chosen.
        reason: Why (printed and written to the report).
        specs: 3 RL specs, 1 SFT spec and 1 evaluation spec, in that order; the RL
            and SFT specs with their ``success_eval`` (when ``success_episodes`` > 0).
        rl_tenants / sft_tenant / eval_tenant: Their tenant ids.
        success_episodes: Episodes of each RL tenant's success measurement
            (0: not measured).
        sft_success_episodes: Episodes of the SFT tenant's (0: not measured).
    """

    profile: Profile
    reason: str
    specs: list[WorkloadSpec]
    rl_tenants: list[str]
    sft_tenant: str
    eval_tenant: str
    success_episodes: int = 0
    sft_success_episodes: int = 0

    @property
    def training_specs(self) -> list[WorkloadSpec]:
        """The specs that create training jobs (replayed in the isolated baseline, which
        measures their ``success_eval``)."""
        return [s for s in self.specs if s.tenant != self.eval_tenant]

    @property
    def multi_tenant_specs(self) -> list[WorkloadSpec]:
        """What the multi-tenant run submits: every spec, without ``success_eval`` (a
        measurement there would delay its tenant's start and overlap the others' work)."""
        return [s.model_copy(update={"success_eval": None}) for s in self.specs]

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
    """The paper's simulators when the budget allows them, else the fast ones (by the
    budget alone: :func:`choose_envs` also checks that they can run here)."""
    if minutes >= PAPER_MIN_MINUTES:
        return "paper", (
            f"the budget ({minutes:g} min) is at least {PAPER_MIN_MINUTES:g} min: "
            f"{_PROFILES['paper'].description}"
        )
    return "fast", (
        f"the budget ({minutes:g} min) is under {PAPER_MIN_MINUTES:g} min, too short for "
        f"LIBERO and ManiSkill3 on this CPU: {_PROFILES['fast'].description}"
    )


def profile_env_specs(profile: Profile) -> list[EnvSpec]:
    """Every simulator a profile runs (RL tenants, then the SFT/eval env)."""
    p = _PROFILES[profile]
    return [EnvSpec.model_validate(rl.env) for rl in p.rl] + [EnvSpec.model_validate(p.sft_env)]


@dataclass(frozen=True)
class EnvChoice:
    """The demo's simulators and why (printed, and written to the report).

    Attributes:
        profile: The chosen profile.
        reason: Why it was chosen, in one sentence.
        unavailable: Simulators (env kinds) of a profile passed over, with why.
    """

    profile: Profile
    reason: str
    unavailable: dict[str, str]


#: ``check(env specs) -> [(kind, why it cannot run here)]``; the demo's is
#: :func:`joynexus.demo.envcheck.check_envs`.
EnvCheck = Callable[[Sequence[EnvSpec]], Awaitable[Sequence[tuple[str, str]]]]


async def _default_check(specs: Sequence[EnvSpec]) -> list[tuple[str, str]]:
    from joynexus.demo.envcheck import check_envs

    return [(p.kind, p.reason) for p in await check_envs(specs)]


def _one_line(problems: Sequence[tuple[str, str]]) -> str:
    return "; ".join(f"{kind}: {why}" for kind, why in problems)


def _why(problems: Sequence[tuple[str, str]]) -> str:
    return problems[0][1] if len(problems) == 1 else _one_line(problems)


async def choose_envs(
    minutes: float, profile: Profile | None = None, *, check: EnvCheck | None = None
) -> EnvChoice:
    """Choose the demo's simulators and check they can run here, before anything starts.

    Args:
        minutes: The demo's budget (picks the profile when ``profile`` is None).
        profile: The profile ``--envs`` forces.
        check: What checks simulators (default: files, then renderers; tests pass
            their own).

    Raises:
        SpecError: the forced profile cannot run here, or no profile can; one line
            naming the simulator and what to install or set.
    """
    run_check = check or _default_check
    if profile is not None:
        if profile not in _PROFILES:
            raise SpecError(f"unknown demo profile {profile!r}; allowed {list(PROFILES)}")
        problems = await run_check(profile_env_specs(profile))
        if problems:
            raise SpecError(f"--envs {profile} cannot run here: {_one_line(problems)}")
        reason = f"chosen with --envs {profile}: {_PROFILES[profile].description}"
        return EnvChoice(profile, reason, {})
    wanted, reason = choose_profile(minutes)
    problems = await run_check(profile_env_specs(wanted))
    if not problems:
        return EnvChoice(wanted, reason, {})
    unavailable = dict(problems)
    if wanted == "paper":
        fallback = await run_check(profile_env_specs("fast"))
        if not fallback:
            names = ", ".join(kind for kind, _ in problems)
            reason = (
                f"the budget ({minutes:g} min) fits the paper's simulators, but {names} "
                f"cannot run here ({_why(problems)}); instead "
                f"{_PROFILES['fast'].description}"
            )
            return EnvChoice("fast", reason, unavailable)
        problems = [*problems, *fallback]
    raise SpecError(f"the demo's simulators cannot run here: {_one_line(problems)}")


def build_mixture(
    out_dir: Path,
    *,
    minutes: float = 10.0,
    profile: Profile | None = None,
    data_dir: Path | None = None,
    rl_updates: int | None = None,
    sft_jobs: int | None = None,
    reason: str | None = None,
    success_episodes: int | None = None,
) -> DemoMixture:
    """Build the demo's specs (checks nothing about the machine: :func:`choose_envs`).

    Args:
        out_dir: Root of the tenants' outputs.
        minutes: Budget of the whole demo (multi-tenant run plus isolated replays); the
            completion targets scale with it.
        profile: Force an environment profile (default: :func:`choose_profile`).
        data_dir: Where the SFT demonstrations live or are recorded (default
            ``<out_dir>/data``).
        rl_updates: Override the RL tenants' completion target.
        sft_jobs: Cap the SFT tenant's jobs (default :data:`SFT_MAX_JOBS`).
        reason: Why these simulators (default: what the budget or ``profile`` says).
        success_episodes: Episodes of each RL and SFT tenant's ``success_eval`` (before
            and after training, seeds from ``EVAL_SEED_BASE``; default: the profile's
            :data:`SUCCESS_EPISODES` for the RL tenants and
            :data:`SFT_SUCCESS_EPISODES` for the SFT tenant); 0 declares none.

    Raises:
        SpecError: an unknown profile, a non-positive budget or a negative
            ``success_episodes``.
    """
    if minutes <= 0:
        raise SpecError(f"minutes must be > 0, got {minutes}", field="minutes")
    if success_episodes is not None and success_episodes < 0:
        raise SpecError(
            f"success_episodes must be >= 0, got {success_episodes}", field="success_episodes"
        )
    if profile is None:
        profile, budget_reason = choose_profile(minutes)
        reason = reason or budget_reason
    elif profile not in _PROFILES:
        raise SpecError(f"unknown demo profile {profile!r}; allowed {list(PROFILES)}")
    else:
        reason = reason or f"chosen with --envs {profile}: {_PROFILES[profile].description}"
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
    sft_success_episodes = (
        SFT_SUCCESS_EPISODES[profile] if success_episodes is None else success_episodes
    )
    if success_episodes is None:
        success_episodes = SUCCESS_EPISODES[profile]
    success = _success_eval(success_episodes)
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
                | success
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
                    "record_failures": p.record_failures,
                    "heldout_fraction": 0.2,
                },
                "action_module": head,
                "optimizer": {"lr": 1e-3},
                "algorithm": {
                    "name": "sft",
                    "samples_per_job": p.sft_samples_per_job,
                    "microbatch_size": p.sft_microbatch_size,
                },
                "scheduling": {
                    "priority": SFT_PRIORITY,
                    "max_in_flight": SFT_PREFETCH,
                    "prefetch": SFT_PREFETCH,
                    "completion_target": n_sft,
                },
                "output_dir": str(out_dir),
            }
            | _success_eval(sft_success_episodes)
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
        success_episodes=success_episodes,
        sft_success_episodes=sft_success_episodes,
    )


def _success_eval(episodes: int) -> dict[str, Any]:
    """A spec's ``success_eval`` of ``episodes`` episodes (none for 0), on evaluation
    seeds far above the demonstration seeds (spec seed + k; the spec refuses any
    overlap)."""
    if episodes <= 0:
        return {}
    return {"success_eval": {"episodes": episodes, "seed": EVAL_SEED_BASE}}
