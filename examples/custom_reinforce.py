"""A client-side REINFORCE composed only from JoyNexus low-level primitives.

The server holds the shared backbone and this tenant's action module; the algorithm
lives here, in the client:

1. submit a ``custom`` workload (the server creates the tenant's slot, nothing else);
2. open an environment session (``reach2d``) and, every iteration, ``reset`` it and roll
   out ``horizon`` decisions with ``predict(mode="sample")`` + ``step``;
3. compute reward-to-go advantages locally (normalised per batch);
4. ``train_batch(loss="reinforce")`` — one optimizer step on the tenant's slot;
5. publish the new weights to inference: ``export_params`` → ``load_weights``;
6. cancel the workload at the end (closes the session, frees the slot).

Run against a server started with ``joynexus serve``::

    JOYNEXUS_URL=http://127.0.0.1:8000 JOYNEXUS_API_KEY=jnx_... \\
        python examples/custom_reinforce.py --tenant alice --base-model tiny:qwen2_5_vl
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from joynexus.client import Client


@dataclass
class Iteration:
    """What one REINFORCE iteration did."""

    mean_reward: float
    loss: float
    policy_version: int
    served_version: int


@dataclass
class Report:
    workload_id: str
    iterations: list[Iteration] = field(default_factory=list)


def reward_to_go(rewards: np.ndarray, dones: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted return from each step to the end of its episode, time-major [T, N]."""
    out = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[1], dtype=np.float32)
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] + gamma * running * (1.0 - dones[t])
        out[t] = running
    return out


def run(
    client: Client,
    tenant: str,
    base_model: str,
    *,
    iterations: int = 3,
    num_envs: int = 2,
    horizon: int = 8,
    gamma: float = 0.95,
    seed: int = 0,
) -> Report:
    """Train ``tenant``'s policy on reach2d with REINFORCE for ``iterations`` updates."""
    env: dict[str, Any] = {
        "kind": "reach2d",
        "num_envs": num_envs,
        "image_size": 32,
        "max_episode_steps": horizon,
    }
    status = client.submit(
        {
            "tenant": tenant,
            "task": "custom",
            "base_model": {"id": base_model},
            "env": env,
            "algorithm": {"name": "reinforce"},
            "action_module": {"type": "oft", "hidden_dim": 32, "num_blocks": 1},
            "seed": seed,
        }
    )
    report = Report(status.workload_id)
    client.wait(status.workload_id, states=["running"], poll_s=0.05)
    session = client.create_session(env)["session_id"]
    try:
        for it in range(iterations):
            obs = client.reset(session, f"iter-{it}", seed=seed + it * num_envs)
            cams: list[np.ndarray] = []
            states: list[np.ndarray] = []
            actions: list[np.ndarray] = []
            rewards = np.zeros((horizon, num_envs), np.float32)
            dones = np.zeros((horizon, num_envs), np.float32)
            instruction = str(obs["instruction"])
            for t in range(horizon):
                pred = client.predict(
                    tenant,
                    obs["cameras"],
                    obs["state"],
                    [instruction] * num_envs,
                    mode="sample",
                )
                cams.append(np.asarray(obs["cameras"]["top"]))
                states.append(np.asarray(obs["state"], np.float32))
                actions.append(pred.actions)
                # The whole action chunk runs open-loop: one decision, rewards summed.
                for k in range(pred.actions.shape[1]):
                    step = client.step(session, pred.actions[:, k])
                    rewards[t] += np.asarray(step["reward"], np.float32)
                    ended = np.asarray(step["terminated"]) | np.asarray(step["truncated"])
                    dones[t] = np.maximum(dones[t], ended.astype(np.float32))
                    obs = step["observation"]
            adv = reward_to_go(rewards, dones, gamma).reshape(-1)
            adv = (adv - adv.mean()) / (adv.std() + 1e-6)
            n = horizon * num_envs
            result = client.train_batch(
                tenant,
                {"top": np.concatenate(cams)},
                np.concatenate(states),
                [instruction] * n,
                np.concatenate(actions),
                loss="reinforce",
                advantages=adv.astype(np.float32),
            )
            params = client.export_params(tenant)
            served = client.load_weights(
                tenant, int(params["policy_version"]), params["named_tensors"]
            )
            report.iterations.append(
                Iteration(float(rewards.mean()), result.loss, result.policy_version, served)
            )
    finally:
        client.cancel(status.workload_id)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="default: $JOYNEXUS_URL")
    parser.add_argument("--api-key", default=None, help="default: $JOYNEXUS_API_KEY")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--base-model", default="tiny:qwen2_5_vl")
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args()
    with Client(args.url, args.api_key) as client:
        report = run(client, args.tenant, args.base_model, iterations=args.iterations)
    for i, it in enumerate(report.iterations):
        print(
            f"iter {i}: mean reward {it.mean_reward:+.3f}  loss {it.loss:+.4f}  "
            f"version {it.policy_version} (served {it.served_version})"
        )


if __name__ == "__main__":
    main()
