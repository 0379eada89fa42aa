"""The README's Python example, runnable: declare a workload, wait for it, then call the
low-level primitives on a real observation.

1. ``submit`` the workload of ``examples/workloads/rl-reach2d.yaml`` (PPO on reach2d)
   and ``wait`` until it has completed its training jobs;
2. open an environment session of the same simulator and ``reset`` it: the observation
   it returns is what ``predict`` takes (``cameras``: one ``uint8 [N, H, W, 3]`` array
   per camera of the tenant's schema; ``state``: ``float32 [N, state_dim]``; one
   instruction per row — see ``docs/OBSERVATIONS.md``);
3. ``predict`` actions with the trained policy (``float32 [N, chunk, action_dim]``) and
   ``step`` the session with the first action of each chunk.

Run it against a server (see the README's tour) with the admin key the server wrote to
``<run-dir>/admin.key``: it creates a tenant of its own (``quickstart-<random>``, or
``--tenant NAME``), prints its key, and trains that tenant::

    joynexus serve --run-dir runs/server --base-model tiny:qwen2_5_vl
    JOYNEXUS_URL=http://127.0.0.1:8000 JOYNEXUS_ADMIN_KEY=$(cat runs/server/admin.key) \\
        python examples/quickstart.py --updates 4

With a tenant's key instead (``--api-key`` / ``JOYNEXUS_API_KEY``, and no admin key) it
trains the tenant the spec names (``reach-ppo``), which must exist and must not have
completed an ``rl`` workload already.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from joynexus.client import APIError, Client, WorkloadStatus

SPEC = Path(__file__).resolve().parent / "workloads" / "rl-reach2d.yaml"


@dataclass
class Result:
    """What the example did."""

    workload: WorkloadStatus
    actions: np.ndarray
    policy_version: int
    reward: float


def run(
    client: Client,
    *,
    spec_path: Path = SPEC,
    tenant: str | None = None,
    base_model: str | None = None,
    updates: int = 4,
) -> Result:
    """Train the spec's tenant for ``updates`` PPO updates, then predict and step once."""
    spec: dict[str, Any] = yaml.safe_load(spec_path.read_text())
    spec["scheduling"]["completion_target"] = updates
    if tenant is not None:
        spec["tenant"] = tenant
    if base_model is not None:
        spec["base_model"]["id"] = base_model
    tenant = str(spec["tenant"])

    # High level: declare the workload and wait for it.
    status = client.submit(spec)
    print(f"submitted {status.workload_id} for tenant {tenant}")
    final = client.wait(status.workload_id, poll_s=0.2)
    print(f"{final.workload_id}: {final.state.value}, policy version {final.policy_version}")
    if final.state.value != "completed":
        raise SystemExit(f"the workload ended {final.state.value}: {final.error}")

    # Low level: a real observation from an environment session, then predict and step.
    session = client.create_session({**spec["env"], "num_envs": 1})["session_id"]
    try:
        obs = client.reset(session, "quickstart", seed=0)
        cameras = {name: np.asarray(frame) for name, frame in obs["cameras"].items()}
        state = np.asarray(obs["state"], dtype=np.float32)
        pred = client.predict(tenant, cameras, state, [str(obs["instruction"])], mode="sample")
        step = client.step(session, pred.actions[:, 0])
    finally:
        client.close_session(session)
    reward = float(np.asarray(step["reward"]).sum())
    print(
        f"predict: cameras {[f'{k} {list(v.shape)}' for k, v in cameras.items()]}, "
        f"state {list(state.shape)} -> actions {list(pred.actions.shape)} "
        f"(policy version {pred.policy_version}); one step: reward {reward:+.3f}"
    )
    return Result(final, pred.actions, pred.policy_version, reward)


def new_tenant(url: str | None, admin_key: str, tenant: str | None) -> tuple[str, str]:
    """Create ``tenant`` (default ``quickstart-<random>``) with the admin key: (name, key)."""
    name = tenant or f"quickstart-{secrets.token_hex(3)}"
    with Client(url, admin_key) as admin:
        key = str(admin.create_tenant(name)["api_key"])
    print(f"created tenant {name} (API key: {key})")
    return name, key


def main(argv: list[str] | None = None) -> Result:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="default: $JOYNEXUS_URL")
    parser.add_argument(
        "--admin-key",
        default=os.environ.get("JOYNEXUS_ADMIN_KEY"),
        help="create a tenant of its own with this admin key (default: $JOYNEXUS_ADMIN_KEY)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="without an admin key: train the spec's tenant with its key ($JOYNEXUS_API_KEY)",
    )
    parser.add_argument("--spec", type=Path, default=SPEC, help="an RL workload spec")
    parser.add_argument(
        "--tenant",
        default=None,
        help="the tenant to train (default: quickstart-<random> with an admin key, else the "
        "spec's tenant)",
    )
    parser.add_argument("--base-model", default=None, help="default: the spec's base model")
    parser.add_argument("--updates", type=int, default=4, help="PPO updates before predicting")
    args = parser.parse_args(argv)
    api_key, tenant = args.api_key, args.tenant
    try:
        if args.admin_key:
            # Its own tenant: a tenant that already completed an rl workload (the tour's
            # reach-ppo) takes no new RL jobs, so the example never reuses one.
            tenant, api_key = new_tenant(args.url, args.admin_key, tenant)
        with Client(args.url, api_key) as client:
            return run(
                client,
                spec_path=args.spec,
                tenant=tenant,
                base_model=args.base_model,
                updates=args.updates,
            )
    except APIError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
