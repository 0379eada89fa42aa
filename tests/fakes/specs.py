"""Small workload specs the fake-plane tests submit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from joynexus.spec.workload import WorkloadSpec, parse_spec
from tests.fakes.base import FAKE_BASE_ID

# ---------------------------------------------------------------------------- specs


def rl_spec(
    tenant: str,
    *,
    target: int | None = 3,
    num_envs: int = 2,
    horizon: int = 2,
    microbatch_size: int | None = None,
    max_in_flight: int = 2,
    **algorithm: Any,
) -> WorkloadSpec:
    """A small RL workload on reach2d (8 px images; one optimizer step per job unless
    ``microbatch_size`` is smaller than ``num_envs * horizon``)."""
    return parse_spec(
        {
            "tenant": tenant,
            "task": "rl",
            "base_model": {"id": FAKE_BASE_ID},
            "env": {
                "kind": "reach2d",
                "num_envs": num_envs,
                "image_size": 8,
                "max_episode_steps": 3,
            },
            "algorithm": {
                "name": "ppo",
                "horizon": horizon,
                "microbatch_size": microbatch_size or num_envs * horizon,
                **algorithm,
            },
            "action_module": {"type": "oft", "hidden_dim": 8, "num_blocks": 1},
            "scheduling": {"completion_target": target, "max_in_flight": max_in_flight},
        }
    )


def eval_spec(
    tenant: str, targets: Sequence[str], *, runs: int = 1, interval_s: float = 0.01
) -> WorkloadSpec:
    """A read-only evaluation of ``targets`` (one episode per run)."""
    return parse_spec(
        {
            "tenant": tenant,
            "task": "eval",
            "base_model": {"id": FAKE_BASE_ID},
            "env": {"kind": "reach2d", "num_envs": 1, "image_size": 8, "max_episode_steps": 3},
            "evaluation": {
                "targets": list(targets),
                "runs": runs,
                "episodes": 1,
                "interval_s": interval_s,
            },
        }
    )


def custom_spec(tenant: str) -> WorkloadSpec:
    """A custom workload: the tenant's slot only, driven through the primitives."""
    return parse_spec(
        {
            "tenant": tenant,
            "task": "custom",
            "base_model": {"id": FAKE_BASE_ID},
            "env": {"kind": "reach2d", "num_envs": 2, "image_size": 8},
            "algorithm": {"name": "reinforce"},
            "action_module": {"type": "oft", "hidden_dim": 8, "num_blocks": 1},
        }
    )
