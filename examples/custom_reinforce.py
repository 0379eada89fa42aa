"""A client-side REINFORCE composed only from the JoyNexus client's primitives.

The server holds the shared backbone and this tenant's action module; the algorithm
lives here, in the client, and its data and jobs flow through the server's Training
Queue and Training Scheduler exactly as the paper's Figure 4 draws them:

1. ``submit`` a ``custom`` workload (the server creates the tenant's slot, nothing else)
   and open an environment session (``reach2d``);
2. every iteration ``reserve`` an RL job (the producer's lease), roll out ``horizon``
   decisions with ``predict(mode="sample")`` + ``step`` (``heartbeat`` keeps the lease),
   ``queue_put`` the samples into the job's partition and ``mark`` it
   ``needs_advantages``;
3. as the advantage stage: ``lease_stage`` the job, ``get_meta`` / ``get_data`` its
   rewards, compute reward-to-go advantages locally, ``put`` them back, ``mark`` it
   ``ready``;
4. as the learner: ``lease`` it, ``get_meta`` / ``get_data`` the whole batch,
   ``train_batch(loss="reinforce")`` (one optimizer step on the tenant's slot),
   ``complete`` the job and ``clear`` its partition (``fail`` it if anything breaks);
5. publish the new weights to inference: ``export_params`` -> ``load_weights``.

At the end the tenant **keeps serving** its trained policy (its custom workload stays
running and holds the slot; the environment session is closed): predict with its key,
``joynexus export`` it, or free the slot with ``joynexus cancel <workload>``;
``--cancel`` does that here (the tenant then has no served policy). The last lines say
which it did.

The example gets its own tenant. Run it against a server started as the README says
(``joynexus serve --run-dir runs/server --base-model tiny:qwen2_5_vl``) with the admin
key the server wrote to ``runs/server/admin.key``: it creates a new tenant
(``reinforce-<random>``, or ``--tenant NAME``) and prints its key::

    JOYNEXUS_URL=http://127.0.0.1:8000 JOYNEXUS_ADMIN_KEY=$(cat runs/server/admin.key) \\
        python examples/custom_reinforce.py --iterations 3

With a tenant's key instead (``--api-key`` / ``JOYNEXUS_API_KEY``) it trains that tenant,
which must have no finished training target (a tenant whose ``rl`` workload completed,
such as the quickstart's ``reach-ppo``, is refused new RL jobs).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from joynexus.client import APIError, Client


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
    tenant: str
    iterations: list[Iteration] = field(default_factory=list)
    #: Whether the workload was cancelled at the end (the tenant serves nothing then).
    cancelled: bool = False


def reward_to_go(rewards: np.ndarray, dones: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted return from each step to the end of its episode, time-major [T, N]."""
    out = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[1], dtype=np.float32)
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] + gamma * running * (1.0 - dones[t])
        out[t] = running
    return out


DOMAIN = "reach2d"
ROLLOUT, LEARNER = "rollout", "learner"


def _camera_field(name: str) -> str:
    return f"camera_{name}"


def collect(
    client: Client, tenant: str, session: str, *, it: int, horizon: int, seed: int
) -> tuple[dict[str, np.ndarray], str, dict[str, Any]]:
    """Reserve an RL job and roll out one batch into its partition (the producer).

    Samples are stored time-major (row ``t * num_envs + e``), so the advantage stage can
    restore the ``[T, N]`` layout from the sample indexes. Returns what was stored, the
    instruction and the job.
    """
    obs = client.reset(session, f"iter-{it}", seed=seed)
    num_envs = int(np.asarray(obs["state"]).shape[0])
    version = int(client.export_params(tenant)["policy_version"])
    job: dict[str, Any] = client.reserve(
        policy_key=f"{tenant}.reinforce",
        domain=DOMAIN,
        task_type="rl",
        sample_count=horizon * num_envs,
        producer_role=ROLLOUT,
        consumer_role=LEARNER,
        behavior_policy_version=version,
    )
    cams: dict[str, list[np.ndarray]] = {k: [] for k in obs["cameras"]}
    states: list[np.ndarray] = []
    actions: list[np.ndarray] = []
    rewards = np.zeros((horizon, num_envs), np.float32)
    dones = np.zeros((horizon, num_envs), np.float32)
    instruction = str(obs["instruction"])
    for t in range(horizon):
        pred = client.predict(
            tenant, obs["cameras"], obs["state"], [instruction] * num_envs, mode="sample"
        )
        for k, v in obs["cameras"].items():
            cams[k].append(np.asarray(v, np.uint8))
        states.append(np.asarray(obs["state"], np.float32))
        actions.append(pred.actions)
        # The whole action chunk runs open-loop: one decision, rewards summed.
        for k in range(pred.actions.shape[1]):
            step = client.step(session, pred.actions[:, k])
            rewards[t] += np.asarray(step["reward"], np.float32)
            ended = np.asarray(step["terminated"]) | np.asarray(step["truncated"])
            dones[t] = np.maximum(dones[t], ended.astype(np.float32))
            obs = step["observation"]
        client.heartbeat(job["job_id"], job["lease_epoch"])  # the rollout is still alive
    data = {_camera_field(k): np.concatenate(v) for k, v in cams.items()}
    data |= {
        "state": np.concatenate(states),
        "action": np.concatenate(actions).astype(np.float32),
        "reward": rewards.reshape(-1),
        "done": dones.reshape(-1),
    }
    meta = {"schema_signature": f"{DOMAIN}.{tenant}", "behavior_policy_version": version}
    client.queue_put(job["partition_id"], data, meta)
    client.mark(job["job_id"], "needs_advantages", job["lease_epoch"])
    return data, instruction, job


def advantages(client: Client, *, num_envs: int, gamma: float) -> None:
    """The advantage stage: normalised reward-to-go of the next job that needs them."""
    job = client.lease_stage("needs_advantages", "computing_advantages", LEARNER, DOMAIN)
    if job is None:
        raise RuntimeError("no job waits for advantages: the producer's mark did not land")
    meta = client.get_meta(job["partition_id"], ["reward", "done"], job["sample_count"], "adv")
    data = client.get_data(meta)
    order = np.argsort(np.asarray(meta["indexes"]))  # rows back to time-major order
    rewards = data["reward"][order].reshape(-1, num_envs)
    dones = data["done"][order].reshape(-1, num_envs)
    rtg = reward_to_go(rewards, dones, gamma).reshape(-1)
    rtg = (rtg - rtg.mean()) / (rtg.std() + 1e-6)
    adv = np.empty_like(rtg)
    adv[order] = rtg
    client.put(meta, {"advantage": adv.astype(np.float32)})
    client.mark(job["job_id"], "ready", job["lease_epoch"])


def learn(client: Client, tenant: str, instruction: str, cameras: list[str]) -> Any:
    """The learner: lease the ready job, train on its batch, complete it, clear its data."""
    job = client.lease(LEARNER, [DOMAIN])
    if job is None:
        raise RuntimeError("no ready job to learn from: the advantage stage did not finish")
    fields = [_camera_field(k) for k in cameras] + ["state", "action", "advantage"]
    meta = client.get_meta(job["partition_id"], fields, job["sample_count"], LEARNER)
    batch = client.get_data(meta)
    result = client.train_batch(
        tenant,
        {k: batch[_camera_field(k)] for k in cameras},
        batch["state"],
        [instruction] * len(meta["indexes"]),
        batch["action"],
        loss="reinforce",
        advantages=batch["advantage"],
    )
    client.complete(job["job_id"], job["lease_epoch"], {"loss": result.loss})
    client.clear(job["partition_id"])
    return result


def run(
    client: Client,
    tenant: str | None = None,
    base_model: str = "tiny:qwen2_5_vl",
    *,
    iterations: int = 3,
    num_envs: int = 2,
    horizon: int = 8,
    gamma: float = 0.95,
    seed: int = 0,
    cancel: bool = False,
) -> Report:
    """Train ``tenant``'s policy (default: the key's own) on reach2d with REINFORCE.

    The custom workload stays running (the tenant serves its trained policy) unless
    ``cancel`` (or an error) cancels it; the environment session is always closed.
    """
    tenant = tenant or str(client.me()["tenant_id"])
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
    report = Report(status.workload_id, tenant)
    client.wait(status.workload_id, states=["running"], poll_s=0.05)
    session = client.create_session(env)["session_id"]
    try:
        for it in range(iterations):
            data, instruction, job = collect(
                client, tenant, session, it=it, horizon=horizon, seed=seed + it * num_envs
            )
            try:
                advantages(client, num_envs=num_envs, gamma=gamma)
                cameras = [k[len("camera_") :] for k in data if k.startswith("camera_")]
                result = learn(client, tenant, instruction, cameras)
            except BaseException as exc:
                # The job must not wait in the scheduler for a lease that never comes.
                client.fail(job["job_id"], f"client error: {type(exc).__name__}")
                raise
            params = client.export_params(tenant)
            served = client.load_weights(
                tenant, int(params["policy_version"]), params["named_tensors"]
            )
            report.iterations.append(
                Iteration(float(data["reward"].mean()), result.loss, result.policy_version, served)
            )
    except BaseException:
        cancel = True  # nothing half-trained is left holding a slot
        raise
    finally:
        client.close_session(session)
        if cancel:
            client.cancel(status.workload_id)
            report.cancelled = True
    return report


def tenant_key(client_url: str | None, admin_key: str | None, tenant: str | None) -> str:
    """A new tenant's key, created with ``admin_key`` (``tenant`` or a fresh name)."""
    name = tenant or f"reinforce-{secrets.token_hex(3)}"
    with Client(client_url, admin_key) as admin:
        key = str(admin.create_tenant(name)["api_key"])
    print(f"created tenant {name} (API key: {key})")
    return key


def _is_admin(url: str | None, key: str | None) -> bool:
    """Whether ``key`` is an admin key (the README exports one as JOYNEXUS_API_KEY too)."""
    with Client(url, key) as client:
        try:
            client.me()
        except APIError as exc:
            if exc.status == 403:  # authenticated, but not a tenant: the admin
                return True
            raise
    return False


def _explain(exc: APIError, tenant: str) -> str:
    """One line for a refusal this example can say more about."""
    if exc.code == "quota_exceeded" and "completion_target" in str(exc):
        return (
            f"tenant {tenant!r} has reached the training target of an earlier workload, so "
            "it takes no new RL jobs; run with an admin key (--admin-key or "
            "JOYNEXUS_ADMIN_KEY) and this example creates a tenant of its own"
        )
    return str(exc)


def main() -> None:
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
        help="without an admin key: train this key's tenant (default: $JOYNEXUS_API_KEY)",
    )
    parser.add_argument(
        "--tenant", default=None, help="the tenant to create (default: reinforce-<random>)"
    )
    parser.add_argument("--base-model", default="tiny:qwen2_5_vl")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument(
        "--cancel", action="store_true", help="cancel the workload at the end (frees the slot)"
    )
    args = parser.parse_args()
    api_key = args.api_key or os.environ.get("JOYNEXUS_API_KEY")
    if not (args.admin_key or api_key):
        sys.exit(
            "error: pass an admin key (--admin-key or JOYNEXUS_ADMIN_KEY; `joynexus serve` "
            "wrote it to <run-dir>/admin.key) and this example creates its own tenant, or a "
            "tenant's key (--api-key or JOYNEXUS_API_KEY)"
        )
    tenant = args.tenant
    try:
        if args.admin_key or _is_admin(args.url, api_key):
            args.admin_key = args.admin_key or api_key
            api_key = tenant_key(args.url, args.admin_key, args.tenant)
            tenant = None  # the new key's own
        with Client(args.url, api_key) as client:
            tenant = tenant or str(client.me()["tenant_id"])
            report = run(
                client, tenant, args.base_model, iterations=args.iterations, cancel=args.cancel
            )
    except APIError as exc:
        sys.exit(f"error: {_explain(exc, str(tenant))}")
    for i, it in enumerate(report.iterations):
        print(
            f"iter {i}: mean reward {it.mean_reward:+.3f}  loss {it.loss:+.4f}  "
            f"version {it.policy_version} (served {it.served_version})"
        )
    if report.cancelled:
        print(
            f"workload {report.workload_id} cancelled: tenant {report.tenant} has no served "
            "policy now (its slot is freed)"
        )
    else:
        served = report.iterations[-1].served_version if report.iterations else 0
        print(
            f"tenant {report.tenant} serves policy version {served}; workload "
            f"{report.workload_id} stays running to hold it (free it: joynexus cancel "
            f"{report.workload_id})"
        )


if __name__ == "__main__":
    main()
