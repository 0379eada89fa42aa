"""π0.5 / π0 parity with lerobot 0.6.1 at a chosen size, both directions, as a command.

``python -m joynexus.bench.pi_parity --size real`` builds lerobot's unmodified
``PI05Config(paligemma_variant="gemma_300m", action_expert_variant="gemma_300m")``
(random weights, the offline tokenizer the tiny builder trains) in the reference
environment, then:

* **in**: lerobot's ``from_pretrained`` + processors + ``select_action`` on one fixed
  observation (seed 11) and noise (seed 21), then JoyNexus loading the same folder as a
  resident base with a ``pi05_expert`` tenant on the checkpoint's statistics, the same
  observation and noise: the largest action difference;
* **out**: that tenant's expert moved a little (so the export is not the input), saved,
  exported with ``--format lerobot``'s code, the folder moved, and lerobot 0.6.1 run on
  it against JoyNexus's actions for the tenant.

Too big for CI (7.8 GB per fp32 copy at ``real``): the tests run the same logic on the
tiny size (tests/interop/test_lerobot_pi05.py, test_lerobot_pi_export.py). One process
at a time: lerobot runs in its own process while JoyNexus holds nothing, and the
JoyNexus models are freed before lerobot runs on the export. Everything is written
under ``--work`` (a temporary folder, deleted at the end unless ``--keep``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from joynexus.interop.reference import run_reference
from joynexus.interop.tiny_pi import PI_SIZES, make_tiny_pi
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.lerobot_export import export_lerobot_checkpoint
from joynexus.models.checkpoints.payload import snapshot_slot, write_checkpoint
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.policies.pi0_expert import Pi0ExpertConfig
from joynexus.models.policies.pi05_expert import Pi05ExpertConfig
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot

TASKS = ["pick up the red block", "push the cube to the goal"]
STATE_DIM = ACTION_DIM = 6
#: Below this much available memory (GiB) a real-size step does not start.
MIN_AVAILABLE_GIB = 10.0


def available_gib() -> float:
    """``MemAvailable`` of ``/proc/meminfo`` in GiB (``inf`` where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def _guard(step: str, needed: float) -> None:
    free = available_gib()
    print(f"[{step}] available memory {free:.1f} GiB, load {os.getloadavg()}", flush=True)
    if free < needed:
        raise SystemExit(f"{step}: only {free:.1f} GiB available (< {needed}); stopped")


def _peak_gib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 2**20


def parameters(folder: Path) -> int:
    """The parameter count of ``folder``'s ``model.safetensors`` (from its header)."""
    count = 0
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            numel = 1
            for n in f.get_slice(key).get_shape():
                numel *= int(n)
            count += numel
    return count


def observation(work: Path, cameras: list[str], side: int, rows: int) -> dict[str, Any]:
    """``rows`` of random cameras and state (seed 11), written for the side script."""
    g = torch.Generator().manual_seed(11)
    pixels = {
        c: torch.randint(0, 256, (rows, side, side, 3), generator=g, dtype=torch.uint8)
        for c in cameras
    }
    state = torch.randn(rows, STATE_DIM, generator=g)
    obs = {
        f"observation.images.{c}": (p.permute(0, 3, 1, 2) / 255).contiguous()
        for c, p in pixels.items()
    }
    save_file({**obs, "observation.state": state}, str(work / "obs.safetensors"))
    (work / "task.json").write_text(json.dumps(TASKS[:rows]))
    return {"pixels": pixels, "state": state, "tasks": TASKS[:rows]}


def lerobot_actions(policy: Path, work: Path, name: str) -> dict[str, torch.Tensor]:
    """lerobot 0.6.1's actions, noise and tokens for ``work``'s observation (noise seed
    21), run from ``policy``'s folder (it names its tokenizer relative to itself)."""
    out = work / f"{name}.safetensors"
    args = ["predict", "--policy", str(policy), "--obs", str(work / "obs.safetensors")]
    args += ["--task", str(work / "task.json"), "--out", str(out), "--seed", "21"]
    binds = [work] if policy.is_relative_to(work) else [work, policy]
    run_reference("lerobot_pi.py", args, binds=binds, cwd=policy, timeout=3000)
    return load_file(str(out))


def joynexus_actions(
    base: ResidentBaseModel, slot: TenantSlot, obs: dict[str, Any], noise: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``slot``'s actions (robot units) and prompt tokens for ``obs`` and ``noise``."""
    norm = slot.normalization
    assert norm is not None
    model_state = norm.normalize(obs["state"].numpy(), "state")
    batch = ObservationBatch(
        cameras={c: p.numpy() for c, p in obs["pixels"].items()},
        state=model_state,
        instructions=obs["tasks"],
    )
    feature = base.canonicalize([(slot.tenant_id, slot.schema, batch)])
    features = GroupedExecutor(base, [slot]).shared_forward({slot.tenant_id: batch})
    expert: Any = slot.action_module  # a pi05_expert / pi0_expert: it denoises
    with torch.no_grad():
        chunk = expert.denoise(features[slot.tenant_id], torch.from_numpy(model_state), noise)
    steps = slot.schema.action_chunk
    actions = torch.from_numpy(norm.unnormalize(chunk[:, :steps, :ACTION_DIM].numpy(), "action"))
    return actions, feature.model_inputs["input_ids"].cpu()


def run(
    *,
    family: str,
    size: str,
    work: Path,
    cameras: list[str],
    rows: int,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Both directions; returns the figures (see the module docstring)."""
    needed = MIN_AVAILABLE_GIB if size == "real" else 0.0
    report: dict[str, Any] = {"family": family, "size": size, "cameras": cameras, "rows": rows}
    report["load_before"] = list(os.getloadavg())
    started = time.perf_counter()
    if checkpoint is None:
        _guard("build", needed)
        t = time.perf_counter()
        checkpoint = make_tiny_pi(
            family, work / "lerobot", cameras=cameras, size=size, timeout=3000
        )
        report["build_s"] = time.perf_counter() - t
    report["parameters"] = parameters(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    side = int((config.get("image_resolution") or [224, 224])[0])
    chunk = int(config["n_action_steps"])
    obs = observation(work, cameras, side, rows)

    _guard("lerobot in", needed)
    t = time.perf_counter()
    theirs = lerobot_actions(checkpoint, work, "lerobot_in")
    report["lerobot_in_s"] = time.perf_counter() - t

    _guard("joynexus in", needed)
    t = time.perf_counter()
    base = ResidentBaseModel.from_pretrained(str(checkpoint))
    report["joynexus_load_s"] = time.perf_counter() - t
    schema = DataSchema(
        name="own",
        cameras={c: CameraSpec(height=side, width=side) for c in cameras},
        state_dim=STATE_DIM,
        action_dim=ACTION_DIM,
        action_chunk=chunk,
        fps=10.0,
        instruction=TASKS[0],
    )
    head = Pi05ExpertConfig() if family == "pi05" else Pi0ExpertConfig()
    slot = TenantSlot("t", schema, base, head, optimizer=OptimizerConfig(lr=1e-3))
    slot.normalization = base.default_normalization(schema)
    t = time.perf_counter()
    mine, tokens = joynexus_actions(base, slot, obs, theirs["noise"])
    report["joynexus_in_s"] = time.perf_counter() - t
    report["tokens_equal"] = bool(torch.equal(tokens, theirs["tokens"]))
    report["shape"] = list(mine.shape)
    report["in_max_abs_diff"] = float((mine - theirs["actions"]).abs().max())
    report["action_spread"] = float(theirs["actions"].abs().max())

    # Out: the tenant's expert moved (a trained tenant's stands in: no optimizer state
    # at this size), saved, exported, the folder moved.
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in slot.action_module.parameters():
            param.add_(torch.randn(param.shape, generator=g) * 1e-3)
    t = time.perf_counter()
    saved = write_checkpoint(snapshot_slot(slot, include_optim=False), work / "outputs", 1)
    exported = export_lerobot_checkpoint(saved, work / "exported", base=base, schema=schema)
    moved = work / "elsewhere" / f"my-{family}"
    moved.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(exported), str(moved))
    report["export_s"] = time.perf_counter() - t
    report["export_files"] = sorted(
        str(p.relative_to(moved)) for p in moved.rglob("*") if p.is_file()
    )
    t = time.perf_counter()
    mine_out, tokens_out = joynexus_actions(base, slot, obs, theirs["noise"])
    report["joynexus_out_s"] = time.perf_counter() - t
    report["out_moved_from_in"] = float((mine_out - mine).abs().max())
    report["joynexus_peak_rss_gib"] = _peak_gib(resource.RUSAGE_SELF)
    del base, slot, theirs
    gc.collect()

    _guard("lerobot out", needed)
    t = time.perf_counter()
    theirs_out = lerobot_actions(moved, work, "lerobot_out")
    report["lerobot_out_s"] = time.perf_counter() - t
    report["out_tokens_equal"] = bool(torch.equal(tokens_out, theirs_out["tokens"]))
    report["out_max_abs_diff"] = float((mine_out - theirs_out["actions"]).abs().max())
    report["lerobot_peak_rss_gib"] = _peak_gib(resource.RUSAGE_CHILDREN)
    report["wall_s"] = time.perf_counter() - started
    report["load_after"] = list(os.getloadavg())
    return report


def parity(
    *,
    family: str = "pi05",
    size: str = "real",
    cameras: list[str] | None = None,
    rows: int = 2,
    work: Path | None = None,
    checkpoint: Path | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    """:func:`run` in ``work`` (default: a temporary folder), deleted after unless
    ``keep``."""
    folder = work or Path(tempfile.mkdtemp(prefix="pi-parity-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return run(
            family=family,
            size=size,
            work=folder.resolve(),
            cameras=cameras or ["top"],
            rows=rows,
            checkpoint=checkpoint.resolve() if checkpoint else None,
        )
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m joynexus.bench.pi_parity")
    parser.add_argument("--family", choices=("pi05", "pi0"), default="pi05")
    parser.add_argument("--size", choices=PI_SIZES, default="real")
    parser.add_argument("--camera", action="append", help="default: top")
    parser.add_argument("--rows", type=int, default=2, choices=(1, 2))
    parser.add_argument("--work", type=Path, help="default: a temporary folder")
    parser.add_argument("--checkpoint", type=Path, help="a folder this command built before")
    parser.add_argument("--keep", action="store_true", help="keep --work's files")
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    args = parser.parse_args(argv)
    report = parity(
        family=args.family,
        size=args.size,
        cameras=args.camera,
        rows=args.rows,
        work=args.work,
        checkpoint=args.checkpoint,
        keep=args.keep,
    )
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
