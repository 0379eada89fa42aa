"""``joynexus eval``: evaluate a served policy on named seeds, in ``lerobot-eval``'s layout.

Against a running server, with the evaluated tenant's key: one environment session of
one sub-env; for each seed a fresh reset with that seed, then decisions (``predict``,
mode ``mean``) whose action chunks are stepped until the episode ends. Every decision
asks for ONE version — ``--version``, else the version that answered the first one —
so two evaluations of one version on the same seeds play the same episodes. Writes
``OUT/eval_info.json`` (per_episode, per_task, per_group, overall with pc_success,
avg_sum_reward, avg_max_reward, eval_s, eval_ep_s) and, with ``--videos``, one mp4 per
episode at ``OUT/videos/<task>/eval_episode_<n>.mp4`` (the first camera).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape

from joynexus.cli.app import app

if TYPE_CHECKING:
    from joynexus.client import Client

console = Console()


def parse_seeds(text: str) -> list[int]:
    """``"0:50"`` (start:stop, stop excluded) or ``"3,7,11"``."""
    try:
        if ":" in text:
            start, stop = (int(p) for p in text.split(":", 1))
            seeds = list(range(start, stop))
        else:
            seeds = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(seeds) > 10_000:
        raise typer.BadParameter(
            f"expected START:STOP or a comma-separated list of 1 to 10000 seeds >= 0, got {text!r}",
            param_hint="--seeds",
        )
    return seeds


def evaluate_served(
    client: Client,
    tenant: str,
    env: dict[str, Any],
    seeds: list[int],
    out: Path,
    *,
    version: int | None = None,
    videos: bool = False,
    max_steps: int = 10_000,
) -> dict[str, Any]:
    """Run the episodes (see module docstring); write and return ``eval_info.json``."""
    from joynexus.data.video import VideoEncoder
    from joynexus.workflows.eval_info import eval_info, write_eval_info

    task = str(env.get("task") or env["kind"])
    info = client.create_session({**env, "num_envs": 1})
    session = str(info["session_id"])
    fps = float((info.get("schema") or {}).get("fps") or 10.0)
    sums: list[float] = []
    peaks: list[float] = []
    wins: list[bool] = []
    started = time.perf_counter()
    try:
        for n, seed in enumerate(seeds):
            obs = client.reset(session, f"eval-{tenant}-s{seed}", seed=seed)
            frames: list[np.ndarray] = []
            total, peak, success, steps = 0.0, -np.inf, False, 0
            done = False
            while not done:
                cameras = {k: np.asarray(v) for k, v in obs["cameras"].items()}
                if videos:
                    frames.append(next(iter(cameras.values()))[0])
                pred = client.predict(
                    tenant,
                    cameras,
                    np.asarray(obs["state"], dtype=np.float32),
                    [str(obs["instruction"])],
                    policy_version=version,
                    mode="mean",
                )
                version = pred.policy_version  # pinned from the first answer on
                for j in range(pred.actions.shape[1]):
                    step = client.step(session, pred.actions[:, j])
                    reward = float(np.asarray(step["reward"]).reshape(-1)[0])
                    total, peak, steps = total + reward, max(peak, reward), steps + 1
                    obs = step["observation"]
                    ended = np.asarray(step["terminated"]) | np.asarray(step["truncated"])
                    if bool(ended.reshape(-1)[0]):
                        success = bool(np.asarray(step["success"]).reshape(-1)[0])
                        done = True
                        break
                if not done and steps >= max_steps:
                    raise RuntimeError(
                        f"seed {seed}: the episode did not end within {max_steps} steps; set "
                        "the env's max_episode_steps"
                    )
            sums.append(total)
            peaks.append(peak)
            wins.append(success)
            if videos and frames:
                h, w = frames[0].shape[:2]
                video = VideoEncoder(
                    out / "videos" / task / f"eval_episode_{n}.mp4", fps=fps, width=w, height=h
                )
                for frame in frames:
                    video.add_frame(np.ascontiguousarray(frame))
                video.close()
    finally:
        client.close_session(session)
    result = eval_info(
        group=str(env["kind"]),
        task=task,
        sum_rewards=sums,
        max_rewards=peaks,
        successes=wins,
        seeds=seeds,
        eval_s=time.perf_counter() - started,
        extra={"target": tenant, "policy_version": version, "env": env},
    )
    if videos:
        paths = [str(Path("videos") / task / f"eval_episode_{n}.mp4") for n in range(len(seeds))]
        for block in (result["overall"], result["per_group"][str(env["kind"])]):
            block["video_paths"] = paths
        result["per_task"][0]["metrics"]["video_paths"] = paths
    write_eval_info(out / "eval_info.json", result)
    return result


@app.command("eval")
def eval_command(
    tenant: Annotated[str, typer.Argument(help="The tenant whose served policy is evaluated.")],
    env: Annotated[
        str,
        typer.Option(
            help='The environment as a JSON env spec, e.g. \'{"kind": "metaworld", "task": '
            '"reach-v3", "max_episode_steps": 200}\'.'
        ),
    ],
    seeds: Annotated[str, typer.Option(help="START:STOP (stop excluded) or '3,7,11'.")] = "0:10",
    out: Annotated[Path, typer.Option(help="Where eval_info.json (and videos/) go.")] = Path(
        "runs/eval"
    ),
    version: Annotated[
        int | None, typer.Option(help="Version to evaluate (default: the one served first).")
    ] = None,
    videos: Annotated[bool, typer.Option("--videos/--no-videos", help="One mp4 per episode.")] = (
        False
    ),
    url: Annotated[str | None, typer.Option("--url", envvar="JOYNEXUS_URL")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="JOYNEXUS_API_KEY")] = None,
) -> None:
    """Evaluate a served policy on named seeds; write eval_info.json as lerobot-eval does."""
    from joynexus.client import APIError, Client
    from joynexus.errors import JoyNexusError

    try:
        env_spec = json.loads(env)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--env") from None
    if not isinstance(env_spec, dict) or "kind" not in env_spec:
        raise typer.BadParameter("expected a JSON object with a 'kind'", param_hint="--env")
    try:
        with Client(url, api_key) as client:
            info = evaluate_served(
                client,
                tenant,
                env_spec,
                parse_seeds(seeds),
                out,
                version=version,
                videos=videos,
            )
    except (APIError, JoyNexusError, RuntimeError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    o = info["overall"]
    console.print(
        f"{o['n_episodes']} episodes: pc_success {o['pc_success']:.1f} %, avg_sum_reward "
        f"{o['avg_sum_reward']:.3f}, avg_max_reward {o['avg_max_reward']:.3f} "
        f"({o['eval_s']:.1f} s); wrote {out / 'eval_info.json'}"
    )
