"""Tenant parameter payloads and checkpoints (paper §4.1.2, Figure 4).

* :func:`export_params` / :func:`load_weights` move one tenant's action-module tensors
  from the Training Model Service to the Inference Model Service. A payload never
  contains base-model weights.
* :func:`snapshot_slot` + :func:`write_checkpoint` persist a slot (:func:`read_checkpoint`
  + :func:`install_checkpoint` restore it) to
  ``<output_dir>/<tenant>/step_<n>/`` with ``action_module.safetensors``, optionally
  ``optimizer.safetensors`` + ``optimizer.json``, and ``manifest.json`` (tenant, schema
  signature and the schema itself, base model id + hash, policy version, step, creation
  time, sha256 of every file). A tenant with a LoRA adapter also gets
  ``adapter_model.safetensors`` + ``adapter_config.json`` (PEFT format) next to its head;
  its payloads carry the adapter as ``lora.*`` tensors. The directory is written under a
  temporary name and renamed into place, so a crash never leaves a half-written
  checkpoint that looks complete.

A tenant trained on normalized data (SFT) computes in normalized units; its
``NormalizationStats`` travel with it — on the slot, in every payload and as
``normalization.json`` in its checkpoints — so an exported module can be served in env
units anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file

from joynexus.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    SchemaMismatchError,
)
from joynexus.models.lora import peft_config, write_peft_adapter
from joynexus.models.normalization import NormalizationStats
from joynexus.models.schema import DataSchema
from joynexus.models.tenant.optim_state import optimizer_tensors, restore_optimizer
from joynexus.models.tenant.slots import TenantSlot, validate_tenant_id

ACTION_MODULE_FILE = "action_module.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_META_FILE = "optimizer.json"
MANIFEST_FILE = "manifest.json"
NORMALIZATION_FILE = "normalization.json"
MANIFEST_FORMAT = 1


@dataclass
class TenantPayload:
    """One tenant's exported action-module state.

    Attributes:
        tenant_id: Owner of the tensors.
        policy_version: The version these tensors are.
        schema_signature: Interface they were trained for; ``load_weights`` refuses a
            slot with a different one.
        named_tensors: ``action_module.<name>`` / ``value_head.<name>`` → tensor (CPU
            copies, independent of later training).
        normalization: The tenant's state/action normalization, when it trains on
            normalized data; ``load_weights`` installs it on the receiving slot.
    """

    tenant_id: str
    policy_version: int
    schema_signature: str
    named_tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    normalization: NormalizationStats | None = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.named_tensors.values())


def export_params(slot: TenantSlot) -> TenantPayload:
    """Snapshot ``slot``'s action module (+ value head): never the base model."""
    return TenantPayload(
        tenant_id=slot.tenant_id,
        policy_version=slot.policy_version,
        schema_signature=slot.schema_signature,
        named_tensors={
            name: t.detach().to("cpu", copy=True) for name, t in slot.state_tensors().items()
        },
        normalization=slot.normalization,
    )


def check_normalization(slot: TenantSlot, normalization: NormalizationStats) -> None:
    """Fail fast when ``normalization`` does not fit the slot's schema.

    Raises:
        SchemaMismatchError: action (or state) stats of another width than the schema's.
    """
    schema = slot.schema
    if normalization.action.dim != schema.action_dim:
        raise SchemaMismatchError(
            f"tenant {slot.tenant_id!r}: normalization action stats have "
            f"{normalization.action.dim} dims, the schema has action_dim {schema.action_dim}",
            field="normalization.action",
        )
    state = normalization.state
    if state is not None and schema.state_dim > 0 and state.dim != schema.state_dim:
        raise SchemaMismatchError(
            f"tenant {slot.tenant_id!r}: normalization state stats have {state.dim} dims, "
            f"the schema has state_dim {schema.state_dim}",
            field="normalization.state",
        )


def load_weights(slot: TenantSlot, payload: TenantPayload) -> None:
    """Install ``payload`` into ``slot`` and adopt its policy version.

    Validation happens before any tensor is written, so a rejected payload leaves the
    slot untouched.

    Raises:
        InvalidRequestError: wrong tenant, a missing or unexpected tensor name, or a
            tensor whose shape/dtype differs from the slot's (the message names it and
            the expected shape).
        SchemaMismatchError: the payload was trained for another schema signature.
    """
    if payload.tenant_id != slot.tenant_id:
        raise InvalidRequestError(
            f"payload belongs to tenant {payload.tenant_id!r}, not {slot.tenant_id!r}",
            field="tenant_id",
        )
    if payload.schema_signature != slot.schema_signature:
        raise SchemaMismatchError(
            f"tenant {slot.tenant_id!r}: payload schema signature "
            f"{payload.schema_signature!r} does not match the slot's "
            f"{slot.schema_signature!r}",
            field="schema_signature",
            expected=slot.schema_signature,
            got=payload.schema_signature,
        )
    if payload.policy_version < 0:
        raise InvalidRequestError(
            f"policy_version must be >= 0, got {payload.policy_version}", field="policy_version"
        )
    if payload.normalization is not None:
        check_normalization(slot, payload.normalization)
    _copy_validated(slot, payload.named_tensors)
    slot.policy_version = payload.policy_version
    if payload.normalization is not None:
        slot.normalization = payload.normalization


def _copy_validated(slot: TenantSlot, tensors: dict[str, torch.Tensor]) -> None:
    current = slot.state_tensors()
    missing = sorted(set(current) - set(tensors))
    unexpected = sorted(set(tensors) - set(current))
    if missing or unexpected:
        raise InvalidRequestError(
            f"tenant {slot.tenant_id!r}: payload tensor names do not match the action "
            f"module: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}",
            field="named_tensors",
            missing=missing,
            unexpected=unexpected,
        )
    for name, target in current.items():
        src = tensors[name]
        if not isinstance(src, torch.Tensor):
            raise InvalidRequestError(
                f"{name}: expected a tensor, got {type(src).__name__}", field=name
            )
        if tuple(src.shape) != tuple(target.shape):
            raise InvalidRequestError(
                f"{name}: expected shape {list(target.shape)}, got {list(src.shape)}",
                field=name,
                expected_shape=list(target.shape),
                shape=list(src.shape),
            )
        if src.dtype != target.dtype:
            raise InvalidRequestError(
                f"{name}: expected dtype {target.dtype}, got {src.dtype}",
                field=name,
                expected_dtype=str(target.dtype),
                dtype=str(src.dtype),
            )
    with torch.no_grad():
        for name, target in current.items():
            target.copy_(tensors[name])


# --- checkpoints ---------------------------------------------------------------------


class CheckpointManifest(BaseModel):
    """``manifest.json`` of one tenant checkpoint."""

    model_config = ConfigDict(extra="forbid")

    format: int = MANIFEST_FORMAT
    tenant_id: str
    schema_signature: str
    data_schema: DataSchema | None = Field(
        default=None,
        description="the tenant's schema (cameras, image sizes) for exports; absent in "
        "checkpoints written before it was recorded",
    )
    base_model_id: str
    base_model_hash: str | None = None
    policy_version: int = Field(ge=0)
    step: int = Field(ge=0)
    created: float
    head: dict[str, Any]
    value_head: dict[str, Any] | None = None
    includes_optimizer: bool
    files: dict[str, str] = Field(description="file name → sha256 hex digest")
    ledger: dict[str, Any] = Field(
        default_factory=dict,
        description="what the orchestrator recorded with these weights (the training job "
        "whose update produced them, how many job updates they contain)",
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_dir(output_dir: str | os.PathLike[str], tenant_id: str, step: int) -> Path:
    """``<output_dir>/<tenant>/step_<n>`` (tenant id validated against path traversal)."""
    if step < 0:
        raise InvalidRequestError(f"step must be >= 0, got {step}", field="step")
    return Path(output_dir) / validate_tenant_id(tenant_id) / f"step_{step}"


@dataclass(frozen=True)
class SlotSnapshot:
    """Everything one slot's checkpoint holds, copied off the live slot.

    :func:`snapshot_slot` takes it under the backbone lock (in-memory copies only);
    :func:`write_checkpoint` writes it with no lock held, so no tenant's predict or
    training step waits for the disk.
    """

    tenant_id: str
    schema_signature: str
    base_model_id: str
    policy_version: int
    head: dict[str, Any]
    value_head: dict[str, Any] | None
    tensors: dict[str, torch.Tensor]
    peft: tuple[dict[str, torch.Tensor], dict[str, Any]] | None
    optimizer: tuple[dict[str, torch.Tensor], dict[str, Any]] | None
    normalization: NormalizationStats | None
    data_schema: DataSchema | None = None


def snapshot_slot(slot: TenantSlot, *, include_optim: bool = True) -> SlotSnapshot:
    """CPU copies of the slot's tensors (and AdamW state): nothing touches the disk."""
    peft = None
    if slot.lora is not None:
        weights = {k: v.clone() for k, v in slot.lora.peft_state_dict().items()}
        peft = (weights, peft_config(slot.lora))
    optimizer = None
    if include_optim:
        optimizer = optimizer_tensors(slot)
    return SlotSnapshot(
        tenant_id=slot.tenant_id,
        schema_signature=slot.schema_signature,
        base_model_id=slot.base_model_id,
        policy_version=slot.policy_version,
        head=slot.head_config.model_dump(mode="json"),
        value_head=None
        if slot.value_head_config is None
        else slot.value_head_config.model_dump(mode="json"),
        tensors={
            n: t.detach().to("cpu", copy=True).contiguous() for n, t in slot.state_tensors().items()
        },
        peft=peft,
        optimizer=optimizer,
        normalization=slot.normalization,
        data_schema=slot.schema,
    )


def write_checkpoint(
    snapshot: SlotSnapshot,
    output_dir: str | os.PathLike[str],
    step: int,
    *,
    base_model_id: str | None = None,
    base_model_hash: str | None = None,
    clock: Callable[[], float] = time.time,
    ledger: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``snapshot`` to ``<output_dir>/<tenant>/step_<step>/`` atomically, with
    its optimizer state when it holds one (needed to resume training).

    ``base_model_id`` (default: the slot's) and ``base_model_hash`` (checked on load)
    go into the manifest with ``clock()``'s creation time and ``ledger``: JSON data (the
    Master's job ledger) committed together with the weights it accounts for.

    Raises:
        InvalidRequestError: bad tenant id or step.
        ConflictError: that checkpoint directory already exists.
    """
    final = checkpoint_dir(output_dir, snapshot.tenant_id, step)
    if final.exists():
        raise ConflictError(f"checkpoint {final} already exists", path=str(final))
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step}.", suffix=".tmp", dir=final.parent))
    try:
        save_file(snapshot.tensors, str(tmp / ACTION_MODULE_FILE))
        if snapshot.peft is not None:
            # The adapter again in PEFT format, for peft.PeftModel.from_pretrained(base,
            # <this dir>); the base model itself is never in a tenant checkpoint.
            write_peft_adapter(*snapshot.peft, tmp)
        if snapshot.optimizer is not None:
            opt_tensors, opt_meta = snapshot.optimizer
            save_file(opt_tensors, str(tmp / OPTIMIZER_FILE))
            (tmp / OPTIMIZER_META_FILE).write_text(json.dumps(opt_meta, indent=2, sort_keys=True))
        if snapshot.normalization is not None:
            (tmp / NORMALIZATION_FILE).write_text(snapshot.normalization.model_dump_json(indent=2))
        files = {p.name: _sha256(p) for p in sorted(tmp.iterdir())}
        manifest = CheckpointManifest(
            tenant_id=snapshot.tenant_id,
            schema_signature=snapshot.schema_signature,
            data_schema=snapshot.data_schema,
            base_model_id=base_model_id or snapshot.base_model_id,
            base_model_hash=base_model_hash,
            policy_version=snapshot.policy_version,
            step=step,
            created=float(clock()),
            head=snapshot.head,
            value_head=snapshot.value_head,
            includes_optimizer=snapshot.optimizer is not None,
            files=files,
            ledger=dict(ledger or {}),
        )
        (tmp / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=2))
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_steps(output_dir: str | os.PathLike[str], tenant_id: str) -> list[tuple[int, Path]]:
    """The tenant's complete checkpoints under ``output_dir`` as ``(step, directory)``,
    oldest first (written atomically: only those whose manifest exists count)."""
    root = Path(output_dir) / tenant_id
    if not root.is_dir():
        return []
    return sorted(
        (int(m.group(1)), child)
        for child in root.iterdir()
        if (m := _STEP_DIR.match(child.name)) and (child / MANIFEST_FILE).is_file()
    )


def find_latest_checkpoint(output_dir: str | os.PathLike[str], tenant_id: str) -> Path | None:
    """The tenant's checkpoint with the highest step under ``output_dir``, or None."""
    steps = checkpoint_steps(output_dir, tenant_id)
    return steps[-1][1] if steps else None


def read_manifest(path: str | os.PathLike[str]) -> CheckpointManifest:
    """Parse ``<path>/manifest.json``.

    Raises:
        NotFoundError: no manifest there.
        InvalidRequestError: the manifest does not parse.
    """
    mpath = Path(path) / MANIFEST_FILE
    if not mpath.is_file():
        raise NotFoundError(f"no checkpoint manifest at {mpath}", path=str(mpath))
    try:
        return CheckpointManifest.model_validate_json(mpath.read_text())
    except ValueError as exc:
        raise InvalidRequestError(f"corrupt manifest {mpath}: {exc}", path=str(mpath)) from exc


def _verified_manifest(
    slot: TenantSlot, root: Path, base_model_hash: str | None, *, same_tenant: bool
) -> CheckpointManifest:
    """The manifest of the checkpoint at ``root`` once it is known to fit ``slot``: its
    tenant (``same_tenant``), schema signature, base model and file hashes."""
    manifest = read_manifest(root)
    if same_tenant and manifest.tenant_id != slot.tenant_id:
        raise InvalidRequestError(
            f"checkpoint {root} belongs to tenant {manifest.tenant_id!r}, not {slot.tenant_id!r}",
            field="tenant_id",
        )
    if manifest.schema_signature != slot.schema_signature:
        raise SchemaMismatchError(
            f"checkpoint schema signature {manifest.schema_signature!r} does not match the "
            f"slot's {slot.schema_signature!r}",
            field="schema_signature",
        )
    if manifest.base_model_id != slot.base_model_id or (
        base_model_hash is not None
        and manifest.base_model_hash is not None
        and manifest.base_model_hash != base_model_hash
    ):
        raise SchemaMismatchError(
            f"checkpoint was trained on base model {manifest.base_model_id!r} "
            f"(hash {manifest.base_model_hash}); this slot runs on {slot.base_model_id!r} "
            f"(hash {base_model_hash})",
            field="base_model",
        )
    for name, digest in manifest.files.items():
        fpath = root / name
        if not fpath.is_file() or _sha256(fpath) != digest:
            raise InvalidRequestError(
                f"checkpoint file {fpath} is missing or its sha256 does not match the manifest",
                path=str(fpath),
            )
    return manifest


def _normalization_of(
    slot: TenantSlot, root: Path, manifest: CheckpointManifest
) -> NormalizationStats | None:
    if NORMALIZATION_FILE not in manifest.files:
        return None
    normalization = NormalizationStats.model_validate_json((root / NORMALIZATION_FILE).read_text())
    check_normalization(slot, normalization)
    return normalization


#: The Gaussian heads' state-independent exploration noise parameter.
NOISE_PARAMETER = "log_std"


def init_slot_from(
    slot: TenantSlot, path: str | os.PathLike[str], *, base_model_hash: str | None = None
) -> CheckpointManifest:
    """Start ``slot`` from another tenant's checkpoint (``init_from``: RL from SFT).

    The checkpoint's action module (and LoRA adapter) and its normalization stats are
    copied in; a module the checkpoint lacks (the critic of a PPO tenant started from
    SFT) keeps its fresh initialisation. The optimizer and the policy version are not
    taken: the slot starts its own history at version 0. From an SFT checkpoint (its
    ledger says ``task: sft``) the policy's exploration noise (``log_std``) is not taken
    either: SFT regresses the mean and never trains it, so the slot keeps the noise its
    own head config declares (``init_log_std``), the RL tenant's choice.

    The action module as started is frozen as the slot's reference policy (the KL
    anchor of its RL, :meth:`TenantSlot.freeze_reference`); restoring the tenant's own
    later checkpoints on top leaves that reference in place.

    Raises:
        NotFoundError: no checkpoint at ``path``.
        InvalidRequestError: a hash mismatch, or tensors that do not fit the slot.
        SchemaMismatchError: a different schema signature or base model.
    """
    root = Path(path)
    manifest = _verified_manifest(slot, root, base_model_hash, same_tenant=False)
    normalization = _normalization_of(slot, root, manifest)
    modules = slot.modules()
    # A critic the checkpoint has and the slot does not (GRPO from PPO) is dropped.
    tensors = {
        k: v
        for k, v in load_file(str(root / ACTION_MODULE_FILE)).items()
        if k.split(".", 1)[0] in modules
    }
    current = slot.state_tensors()
    own_noise = manifest.ledger.get("task") == "sft"

    def keeps_fresh(name: str) -> bool:
        return own_noise and name.endswith(f".{NOISE_PARAMETER}")

    tensors = {k: v for k, v in tensors.items() if not keeps_fresh(k)}
    taken = {p for p in modules if any(k.startswith(f"{p}.") for k in tensors)}
    # What the checkpoint has must fit; modules it lacks entirely stay fresh (and so
    # does the exploration noise an SFT checkpoint never trained).
    fresh = {k: v for k, v in current.items() if k.split(".", 1)[0] not in taken or keeps_fresh(k)}
    _copy_validated(slot, {**tensors, **fresh})
    if normalization is not None:
        slot.normalization = normalization
    slot.freeze_reference()
    return manifest


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint read from disk and verified against a slot, not yet installed:
    :func:`read_checkpoint` needs no lock, :func:`install_checkpoint` copies in memory."""

    manifest: CheckpointManifest
    tensors: dict[str, torch.Tensor]
    normalization: NormalizationStats | None
    optimizer: tuple[dict[str, torch.Tensor], dict[str, Any]] | None


def read_checkpoint(
    slot: TenantSlot,
    path: str | os.PathLike[str],
    *,
    base_model_hash: str | None = None,
    load_optim: bool = True,
) -> LoadedCheckpoint:
    """Read and verify the checkpoint at ``path`` for ``slot`` (every file against the
    manifest's sha256); the slot is not changed.

    Raises:
        NotFoundError: no checkpoint at ``path``.
        InvalidRequestError: another tenant's checkpoint or a hash mismatch.
        SchemaMismatchError: a different schema signature or base model.
    """
    root = Path(path)
    manifest = _verified_manifest(slot, root, base_model_hash, same_tenant=True)
    normalization = _normalization_of(slot, root, manifest)
    optimizer = None
    if load_optim and manifest.includes_optimizer:
        device = next(slot.parameters()).device
        optimizer = (
            load_file(str(root / OPTIMIZER_FILE), device=str(device)),
            json.loads((root / OPTIMIZER_META_FILE).read_text()),
        )
    tensors = load_file(str(root / ACTION_MODULE_FILE))
    return LoadedCheckpoint(manifest, tensors, normalization, optimizer)


def install_checkpoint(slot: TenantSlot, loaded: LoadedCheckpoint) -> CheckpointManifest:
    """Copy a read checkpoint into ``slot``: module, optimizer, normalization, version.

    Raises:
        InvalidRequestError / SchemaMismatchError: tensors or optimizer state that do
            not fit the slot.
    """
    _copy_validated(slot, loaded.tensors)
    if loaded.normalization is not None:
        slot.normalization = loaded.normalization
    if loaded.optimizer is not None:
        restore_optimizer(slot, *loaded.optimizer)
    slot.policy_version = loaded.manifest.policy_version
    return loaded.manifest
