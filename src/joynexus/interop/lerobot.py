"""LeRobot policy checkpoints: recognising and checking them, and the real ``lerobot``.

A LeRobot policy directory (what ``PreTrainedPolicy.save_pretrained`` writes, and what
hub checkpoints such as ``lerobot/smolvla_base`` hold) is ``config.json`` with the
policy's ``"type"`` (not a transformers ``"model_type"``), ``model.safetensors``, and the
processor pipelines ``policy_preprocessor.json`` / ``policy_postprocessor.json`` whose
normalizer steps keep their statistics in ``state_file`` safetensors next to them.

:func:`read_lerobot_checkpoint` reads and checks such a directory without loading its
weights (what ``spec check`` and workload submission run); :func:`check_lerobot_base`
is the spec-time check of a ``base_model.id``. :func:`run_lerobot_side` runs
:mod:`joynexus.interop.side.lerobot_run` with the side venv's python — ``lerobot`` pins
torch < 2.11 and transformers < 5 and cannot be imported here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict
from safetensors.torch import load_file

from joynexus.errors import InvalidRequestError, ServiceUnavailableError, SpecError
from joynexus.interop.venvs import side_python

#: Where the LeRobot venv is, when not ``.venv-lerobot`` next to the project.
LEROBOT_VENV_ENV = "JOYNEXUS_LEROBOT_VENV"
LEROBOT_VENV = ".venv-lerobot"
SIDE_SCRIPT = Path(__file__).with_name("side") / "lerobot_run.py"
#: The families JoyNexus reads (LeRobot ``type`` values).
FAMILIES = ("smolvla", "pi0", "pi05")
#: The families ``make-tiny`` builds through the real classes (see side.lerobot_run).
TINY_FAMILIES = ("smolvla",)
#: The families hosted as the resident prefix (models.policies.smolvla_expert,
#: models.policies.pi0_expert, models.policies.pi05_expert).
HOSTED_FAMILIES = ("smolvla", "pi0", "pi05")
#: ``base_model: {id: tiny:smolvla}``: the tiny SmolVLA make-tiny writes by default.
TINY_LEROBOT = "smolvla"
TINY_ID = "tiny:" + TINY_LEROBOT
#: Its sizes (the defaults of :func:`make_tiny_lerobot`), known before it is built.
TINY_STATE_DIM = TINY_ACTION_DIM = 6
TINY_MAX_DIM = 8
TINY_CHUNK = 4
TINY_STEPS = 3
#: Other policy types lerobot 0.4.x saves; named so a checkpoint of one is refused by
#: name rather than as an unknown directory.
OTHER_LEROBOT_TYPES = (
    "act",
    "diffusion",
    "tdmpc",
    "vqbet",
    "pi0fast",
    "pi0_fast",
    "sac",
    "reward_classifier",
    "groot",
    "xvla",
)
PREPROCESSOR = "policy_preprocessor.json"
POSTPROCESSOR = "policy_postprocessor.json"
WEIGHTS = "model.safetensors"
STATE_KEY = "observation.state"
ACTION_KEY = "action"
IMAGE_PREFIX = "observation.images."


class LeRobotCheckpoint(BaseModel):
    """What a LeRobot policy directory says about itself (weights not loaded)."""

    model_config = ConfigDict(frozen=True)

    path: str
    type: str
    state_dim: int
    action_dim: int
    cameras: list[str]
    chunk_size: int
    max_state_dim: int
    max_action_dim: int
    num_steps: int
    #: ``{feature: {"mean"|"std"|"min"|"max": [...]}}`` of the preprocessor's normalizer.
    stats: dict[str, dict[str, list[float]]]


def _fail(path: Path, message: str, field: str = "base_model.id") -> SpecError:
    return SpecError(f"LeRobot checkpoint {str(path)!r}: {message}", field=field)


def is_lerobot_dir(path: str | Path) -> bool:
    """A directory whose ``config.json`` names a LeRobot policy ``type`` (transformers
    configs carry ``model_type`` instead)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "type" in data and "model_type" not in data


def _processor_stats(root: Path, name: str) -> dict[str, dict[str, list[float]]]:
    """The normalizer statistics of processor pipeline ``name`` (its state files)."""
    file = root / name
    if not file.is_file():
        raise _fail(
            root,
            f"{name} is missing; a LeRobot policy directory holds its processor pipelines "
            f"({PREPROCESSOR}, {POSTPROCESSOR}) and their normalization state files",
        )
    try:
        steps = json.loads(file.read_text()).get("steps", [])
    except (OSError, ValueError, AttributeError) as exc:
        raise _fail(root, f"{name} is not a processor pipeline: {exc}") from exc
    stats: dict[str, dict[str, list[float]]] = {}
    for step in steps:
        state_file = step.get("state_file") if isinstance(step, dict) else None
        if not state_file:
            continue
        if not (root / state_file).is_file():
            raise _fail(root, f"{name} names the state file {state_file!r}, which is missing")
        for key, tensor in load_file(str(root / state_file)).items():
            feature, _, stat = key.rpartition(".")
            stats.setdefault(feature, {})[stat] = [float(x) for x in tensor.flatten().tolist()]
    return stats


def read_lerobot_checkpoint(path: str | Path) -> LeRobotCheckpoint:
    """Read and check a local LeRobot policy directory.

    Raises:
        SpecError: not a LeRobot policy, a family JoyNexus does not read, missing weights
            or processor files, or features without state / action.
    """
    root = Path(path).expanduser()
    if not is_lerobot_dir(root):
        raise _fail(root, "config.json with a policy 'type' not found")
    config: dict[str, Any] = json.loads((root / "config.json").read_text())
    kind = str(config["type"])
    if kind not in FAMILIES:
        known = "a LeRobot policy type" if kind in OTHER_LEROBOT_TYPES else "an unknown type"
        raise _fail(
            root,
            f"type {kind!r} is {known} JoyNexus cannot host; supported: {list(FAMILIES)}",
        )
    if not (root / WEIGHTS).is_file():
        raise _fail(root, f"{WEIGHTS} is missing")
    stats = _processor_stats(root, PREPROCESSOR)
    _processor_stats(root, POSTPROCESSOR)
    inputs = config.get("input_features") or {}
    outputs = config.get("output_features") or {}
    if STATE_KEY not in inputs or ACTION_KEY not in outputs:
        raise _fail(root, f"config.json declares no {STATE_KEY!r} input or {ACTION_KEY!r} output")
    return LeRobotCheckpoint(
        path=str(root),
        type=kind,
        state_dim=int(inputs[STATE_KEY]["shape"][0]),
        action_dim=int(outputs[ACTION_KEY]["shape"][0]),
        cameras=[k.removeprefix(IMAGE_PREFIX) for k in inputs if k.startswith(IMAGE_PREFIX)],
        chunk_size=int(config["chunk_size"]),
        max_state_dim=int(config.get("max_state_dim", inputs[STATE_KEY]["shape"][0])),
        max_action_dim=int(config.get("max_action_dim", outputs[ACTION_KEY]["shape"][0])),
        num_steps=int(config.get("num_steps", config.get("num_inference_steps", 10))),
        stats=stats,
    )


class SchemaDims(BaseModel):
    """The dims of a tenant schema that a checkpoint's expert bounds."""

    state_dim: int
    action_dim: int
    action_chunk: int


def schema_problems(ckpt: LeRobotCheckpoint, dims: SchemaDims) -> list[tuple[str, str]]:
    """``(field, message)`` for each way ``dims`` do not fit the checkpoint's expert."""
    checks = (
        ("schema.action_dim", dims.action_dim, ckpt.max_action_dim, "max_action_dim"),
        ("schema.state_dim", dims.state_dim, ckpt.max_state_dim, "max_state_dim"),
        ("schema.action_chunk", dims.action_chunk, ckpt.chunk_size, "chunk_size"),
    )
    return [
        (
            field,
            f"{value} exceeds the {ckpt.type} checkpoint's {key} of {limit}; use a schema with "
            f"at most {limit}",
        )
        for field, value, limit, key in checks
        if value > limit
    ]


def hub_family(model_id: str) -> str | None:
    """The LeRobot policy family a ``lerobot/<family>_<...>`` hub id names, if any."""
    org, _, name = model_id.partition("/")
    if org != "lerobot" or not name or "/" in name:
        return None
    name = name.lower().replace("-", "_")
    # π0-FAST is its own family (lerobot's pi0fast), not π0 with a suffix.
    if name.startswith("pi0_fast"):
        return "pi0fast"
    head = name.split("_")[0]
    return head if head in (*FAMILIES, *OTHER_LEROBOT_TYPES, "pi0fast") else None


def check_lerobot_base(model_id: str, schema: SchemaDims | None) -> LeRobotCheckpoint | None:
    """The spec-time check of ``base_model.id`` when it names a LeRobot policy.

    A local LeRobot directory is read and checked against ``schema``; a ``lerobot/...``
    hub id is checked by the family it names (offline: nothing is downloaded). Returns
    the checkpoint read, or ``None`` when ``model_id`` is no LeRobot policy.

    Raises:
        SpecError: a bad checkpoint (see :func:`read_lerobot_checkpoint`), a schema wider
            or longer than its expert, an unsupported family named by hub id, or a
            family JoyNexus reads but does not host as its resident prefix (π0, π0.5).
    """
    if model_id == TINY_ID:
        tiny = LeRobotCheckpoint(
            path=model_id,
            type=TINY_LEROBOT,
            state_dim=TINY_STATE_DIM,
            action_dim=TINY_ACTION_DIM,
            cameras=["top"],
            chunk_size=TINY_CHUNK,
            max_state_dim=TINY_MAX_DIM,
            max_action_dim=TINY_MAX_DIM,
            num_steps=TINY_STEPS,
            stats={},
        )
        _check_fits(tiny, schema)
        return tiny
    path = Path(os.path.expanduser(model_id))
    if not path.is_dir():
        family = hub_family(model_id)
        if family is None:
            return None
        if family not in FAMILIES:
            raise SpecError(
                f"base model {model_id!r} is a LeRobot {family!r} policy; JoyNexus hosts the "
                f"LeRobot families {list(HOSTED_FAMILIES)} only",
                field="base_model.id",
            )
        if family not in HOSTED_FAMILIES:
            raise _not_hosted(model_id, family)
        # A hosted family by hub id (nothing is downloaded at spec time): its dims are
        # checked when the server has fetched it and builds the tenant's expert.
        return None
    if not is_lerobot_dir(path):
        return None
    ckpt = read_lerobot_checkpoint(path)
    _check_fits(ckpt, schema)
    if ckpt.type not in HOSTED_FAMILIES:
        raise _not_hosted(model_id, ckpt.type)
    return ckpt


def _check_fits(ckpt: LeRobotCheckpoint, schema: SchemaDims | None) -> None:
    problems = schema_problems(ckpt, schema) if schema is not None else []
    if problems:
        raise SpecError(
            f"the schema does not fit the {ckpt.type} checkpoint {ckpt.path!r}:\n"
            + "\n".join(f"  {f}: {m}" for f, m in problems),
            fields=[f for f, _ in problems],
            problems=dict(problems),
        )


def _not_hosted(model_id: str, family: str) -> SpecError:
    return SpecError(
        f"base model {model_id!r} is a LeRobot {family!r} policy: JoyNexus reads its "
        f"checkpoint but hosts only {list(HOSTED_FAMILIES)} as a resident prefix "
        "(docs/BACKBONES.md)",
        field="base_model.id",
    )


# -- the side venv ---------------------------------------------------------------------


def lerobot_python() -> Path:
    """The LeRobot venv's python (``make install`` builds ``.venv-lerobot``):
    ``$JOYNEXUS_LEROBOT_VENV``, else ``.venv-lerobot`` in the checkout or next to the venv."""
    return side_python(LEROBOT_VENV, LEROBOT_VENV_ENV)


def run_lerobot_side(
    args: list[str], *, timeout: float = 600.0, cwd: str | Path | None = None
) -> dict[str, Any]:
    """Run :mod:`joynexus.interop.side.lerobot_run` with ``args`` in the LeRobot venv
    (in folder ``cwd``: an exported policy names its own VLM folder relative to it).

    Returns:
        The JSON object the script prints last.

    Raises:
        ServiceUnavailableError: the LeRobot venv is not built (says how to build it).
        InvalidRequestError: the script failed (its last stderr lines).
    """
    python = lerobot_python()
    if not python.is_file():
        raise ServiceUnavailableError(
            f"the LeRobot venv is missing ({python}); build it with "
            "`bash scripts/install-python-extras.sh .venv/bin/python` (make install does) "
            f"or point ${LEROBOT_VENV_ENV} at one",
            venv=str(python),
        )
    proc = subprocess.run(
        [str(python), str(SIDE_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    if proc.returncode != 0:
        raise InvalidRequestError(
            f"lerobot ({python}) failed: {proc.stderr.strip()[-1500:]}",
            command=args[:1],
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise InvalidRequestError(f"lerobot printed no result: {proc.stdout[-500:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def make_tiny_lerobot(
    family: str,
    out: str | Path,
    *,
    seed: int = 0,
    state_dim: int = TINY_STATE_DIM,
    action_dim: int = TINY_ACTION_DIM,
    cameras: list[str] | None = None,
) -> LeRobotCheckpoint:
    """Build a tiny random LeRobot checkpoint of ``family`` with the real ``lerobot``
    classes (its VLM a local tiny SmolVLM, never the hub) and read it back.

    Raises:
        InvalidRequestError: a family make-tiny does not build, or lerobot failed.
        ServiceUnavailableError: no LeRobot venv.
    """
    if family not in TINY_FAMILIES:
        raise InvalidRequestError(
            f"make-tiny --family {family!r}: tiny LeRobot checkpoints exist for "
            f"{list(TINY_FAMILIES)} (lerobot 0.4.4's pi0/pi05 need openpi's patched "
            "transformers and its Gemma 300M/2B variants)",
            field="family",
        )
    args = ["make-tiny", "--family", family, "--out", str(out), "--seed", str(seed)]
    args += ["--state-dim", str(state_dim), "--action-dim", str(action_dim)]
    args += ["--max-state-dim", str(TINY_MAX_DIM), "--max-action-dim", str(TINY_MAX_DIM)]
    args += ["--chunk-size", str(TINY_CHUNK), "--num-steps", str(TINY_STEPS)]
    for camera in cameras or []:
        args += ["--camera", camera]
    run_lerobot_side(args)
    return read_lerobot_checkpoint(out)


def write_processors(
    src: str | Path, out: str | Path, stats: dict[str, dict[str, list[float]]] | None = None
) -> None:
    """Copy a checkpoint's processor pipelines into ``out`` (kept as LeRobot wrote them),
    their normalizer state files rewritten with ``stats`` (a tenant's own statistics,
    ``{feature: {stat: values}}``) where given, else copied.

    Raises:
        SpecError: ``src`` lacks a pipeline or a state file it names.
    """
    from safetensors.torch import save_file

    root, dst = Path(src), Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    for name in (PREPROCESSOR, POSTPROCESSOR):
        _processor_stats(root, name)  # the same checks as reading
        (dst / name).write_text((root / name).read_text())
        for step in json.loads((root / name).read_text()).get("steps", []):
            state_file = step.get("state_file") if isinstance(step, dict) else None
            if not state_file:
                continue
            tensors = load_file(str(root / state_file))
            for key in list(tensors):
                feature, _, stat = key.rpartition(".")
                values = (stats or {}).get(feature, {}).get(stat)
                if values is not None:
                    tensors[key] = torch.tensor(values, dtype=tensors[key].dtype)
            save_file(tensors, str(dst / state_file))
