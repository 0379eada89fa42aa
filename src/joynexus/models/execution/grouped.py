"""Group-batched execution over a shared frozen backbone (paper §4.3, §5.2, Appendix A.6).

:class:`GroupedExecutor` runs ONE backbone forward over the concatenation of several
tenants' batches, splits the output by the VLAFeature slice table, and hands each
tenant's rows to that tenant's :class:`~joynexus.models.tenant.slots.TenantSlot`. Everything
after the split is per tenant: its own loss, backward, clipping, AdamW step and policy
version. No loss, gradient, optimizer state or version is ever averaged or shared.

``serial_*`` methods do the same work one tenant at a time (one backbone forward each);
they are the baseline of the equivalence proof (Figure 12) and of the benchmark
(Figure 10).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import torch

from joynexus.errors import CapacityError, ConflictError, InvalidRequestError, NotFoundError
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.feature import VLAFeature
from joynexus.models.canon.tensor import moved_to
from joynexus.models.execution.decode import DecodeGroup, decode_groups
from joynexus.models.execution.grouped_step import sft_step
from joynexus.models.lora import LoRAAdapter, LoRARows, LoRASegment, lora_rows
from joynexus.models.schema import DataSchema
from joynexus.models.tenant.slots import (
    BaseModelRef,
    StepResult,
    TenantSlot,
    unique_parameter_bytes,
)
from joynexus.models.types import BackboneOutput
from joynexus.utils.intra_op import serial_intra_op
from joynexus.utils.priority_lock import PriorityRLock


class GroupableBackbone(BaseModelRef, Protocol):
    """The resident base model as the executor uses it (see ``models/backbone.py``)."""

    def canonicalize(
        self,
        groups: Sequence[tuple[str, DataSchema, ObservationBatch]],
        *,
        validated: bool = False,
    ) -> VLAFeature: ...

    def encode(self, feature: VLAFeature) -> BackboneOutput:
        """The frozen forward; a backbone that hosts LoRA also takes ``grad=True``."""
        ...

    def parameter_bytes(self) -> int: ...

    def images_per_row(self, feature: VLAFeature) -> list[int]:
        """Images each row feeds the vision tower (vision LoRA maps them back to rows)."""
        ...

    def forward_splits(self, feature: VLAFeature) -> bool:
        """Whether a forward of ``feature`` is worth torch's intra-op threads."""
        ...

    def forward_took(self, feature: VLAFeature, split: bool, seconds: float) -> None:
        """How long that forward took, run that way (what the next choice reads)."""
        ...


SlotResolver = Callable[[str, "int | None"], TenantSlot]
"""``(tenant_id, policy_version) -> TenantSlot``: which slot decodes a request."""


@dataclass(frozen=True, slots=True)
class ServeRequest:
    """One predict request as the executor runs it (the Inference Queue's payload).

    The Inference Model Service builds it once, at admission: it resolves the slot that
    will decode it and validates the observations against that slot's schema there, so
    the batch path neither resolves nor validates again.

    Attributes:
        tenant_id: The requesting tenant.
        observation: Its observations (model units).
        policy_version: The version asked for (``None``: latest).
        mode: ``"mean"`` | ``"sample"``; ``None`` takes the batch call's default.
        slot: The slot resolved at admission, with ``observation`` already validated
            against its schema; ``None``: resolve (and validate) when the batch runs.
        enqueued_at: ``time.perf_counter()`` at admission (queue-wait metering).
    """

    tenant_id: str
    observation: ObservationBatch
    policy_version: int | None = None
    mode: Literal["mean", "sample"] | None = None
    slot: TenantSlot | None = None
    enqueued_at: float = 0.0


@dataclass(slots=True)
class StageTimes:
    """Where one grouped inference batch spent its time, in seconds (filled by the
    executor): canonicalization (resize, pixel layout, padding; before the lock),
    waiting for the backbone lock, the backbone forward, and the tenants' heads (decode
    under the lock, the copy to host after it)."""

    lock_wait_s: float = 0.0
    canonicalize_s: float = 0.0
    backbone_s: float = 0.0
    head_s: float = 0.0

    @property
    def device_s(self) -> float:
        """Canonicalize + backbone + heads: the batch's own work (not its waiting)."""
        return self.canonicalize_s + self.backbone_s + self.head_s


@dataclass(frozen=True)
class InferenceResult:
    """One inference request's answer.

    Attributes:
        tenant_id: The requesting tenant.
        policy_version: The version of the tenant's action module that answered.
        actions: ``float32 [b, chunk, action_dim]`` for the request's ``b`` rows.
        log_probs: ``float32 [b]`` log-density of sampled actions (``"sample"`` mode:
            Gaussian OFT heads, Flow-SDE chains of flow heads), else ``None``.
        values: ``float32 [b]`` critic values when the tenant has a value head.
        chain: ``float32 [b, steps + 1, chunk, action_dim]`` Flow-SDE chain of a
            flow-matching head in ``"sample"`` mode (recorded by rollouts), else None.
    """

    tenant_id: str
    policy_version: int
    actions: np.ndarray
    log_probs: np.ndarray | None = None
    values: np.ndarray | None = None
    chain: np.ndarray | None = None


def _numpy(tensor: torch.Tensor | None) -> np.ndarray | None:
    return None if tensor is None else tensor.float().cpu().numpy()


def _to_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return moved_to(torch.from_numpy(np.ascontiguousarray(array)), device)


class GroupedExecutor:
    """Runs tenant slots over one shared base model, grouped or serially.

    Thread-safe: torch work is serialised by one lock, so an inference thread and a
    training thread can share one executor (or two executors the same lock).

    Args:
        base: The resident base model (shared by reference).
        slots: The tenants' slots; each must reference ``base``.
        tenant_memory_budget: Optional cap, in bytes, on the summed training footprint
            (:meth:`TenantSlot.training_bytes`: adapter + head + AdamW state) of all
            slots; the base is not counted (it is shared once).
        lock: The lock that serialises torch work on ``base`` (the services pass the
            backbone's one lock, :func:`joynexus.services.tenancy.backbone_lock`, so a
            batch takes exactly one lock); default: a private one.

    Raises:
        InvalidRequestError: a slot is attached to another base model, or two slots
            have the same tenant id.
        CapacityError: a slot would exceed ``tenant_memory_budget``.
    """

    def __init__(
        self,
        base: GroupableBackbone,
        slots: Iterable[TenantSlot] = (),
        *,
        tenant_memory_budget: int | None = None,
        lock: PriorityRLock | None = None,
    ):
        self.base = base
        self.slots: dict[str, TenantSlot] = {}
        self.tenant_memory_budget = tenant_memory_budget
        self._lock = lock if lock is not None else PriorityRLock()
        for slot in slots:
            self.add_slot(slot)

    # --- tenants ---------------------------------------------------------------------

    def add_slot(self, slot: TenantSlot) -> None:
        if slot.base is not self.base:
            raise InvalidRequestError(
                f"tenant {slot.tenant_id!r}: slot is attached to another base model "
                f"({slot.base_model_id!r}); the executor runs {self.base.model_id!r}",
                tenant_id=slot.tenant_id,
            )
        if slot.tenant_id in self.slots:
            raise InvalidRequestError(
                f"tenant {slot.tenant_id!r} already has a slot", tenant_id=slot.tenant_id
            )
        budget = self.tenant_memory_budget
        if budget is not None:
            used = sum(s.training_bytes() for s in self.slots.values())
            need = slot.training_bytes()
            if used + need > budget:
                raise CapacityError(
                    f"tenant {slot.tenant_id!r} needs {need:,} bytes (adapter + head + "
                    f"optimizer state); {len(self.slots)} tenants already hold {used:,} of "
                    f"the {budget:,}-byte tenant memory budget, so it does not fit "
                    f"({budget - used:,} bytes free)",
                    tenant_id=slot.tenant_id,
                    needed_bytes=need,
                    used_bytes=used,
                    budget_bytes=budget,
                )
        self.slots[slot.tenant_id] = slot

    def remove_slot(self, tenant_id: str) -> TenantSlot:
        return self.slots.pop(self.slot(tenant_id).tenant_id)

    def slot(self, tenant_id: str) -> TenantSlot:
        """The slot of ``tenant_id``.

        Raises:
            NotFoundError: no such tenant on this executor.
        """
        try:
            return self.slots[tenant_id]
        except KeyError:
            raise NotFoundError(
                f"tenant {tenant_id!r} has no action module here; known: {sorted(self.slots)}",
                tenant_id=tenant_id,
            ) from None

    # --- shared forward --------------------------------------------------------------

    def shared_forward(
        self,
        batches: Mapping[str, ObservationBatch],
        *,
        schemas: Mapping[str, DataSchema] | None = None,
        adapters: Mapping[str, LoRAAdapter | None] | None = None,
        grad: bool = False,
        validated: bool = False,
        times: StageTimes | None = None,
        feature: VLAFeature | None = None,
    ) -> dict[str, BackboneOutput]:
        """ONE backbone forward over all ``batches``, split back per tenant.

        Rows of a tenant with a LoRA adapter go through that adapter (a mixed-adapter
        forward: one pass, each row's own low-rank delta, no copy of base weights);
        the other rows take the base path.

        Args:
            batches: group key (a tenant id) → observations.
            schemas: Optional key → schema, for tenants served by slots that are
                not registered on this executor (versioned serving); default: each
                registered slot's schema.
            adapters: Optional key → adapter (None = base path); default: each
                registered slot's adapter.
            grad: Record autograd through the adapters (LoRA training). Without any
                adapter in the batch the forward stays graph-free.
            validated: The batches were already checked against their schemas.
            times: Filled with the canonicalization and backbone seconds.
            feature: ``batches`` already canonicalized (in this order), e.g. before
                the caller took the backbone lock.

        Returns:
            key → those rows of the backbone output (detached unless ``grad`` and an
            adapter is present).
        """
        groups = [
            (tid, schemas[tid] if schemas and tid in schemas else self.slot(tid).schema, batch)
            for tid, batch in batches.items()
        ]
        if not groups:
            raise InvalidRequestError("expected at least one tenant batch", field="batches")
        t0 = time.perf_counter()
        if feature is None:
            feature = self.base.canonicalize(groups, validated=validated)
        if times is not None:
            times.canonicalize_s += time.perf_counter() - t0
        out = self._encode(feature, adapters=adapters, grad=grad, times=times)
        result: dict[str, BackboneOutput] = {}
        for tid in batches:
            entry = feature.slice_of(tid)
            result[tid] = out.rows(entry.start, entry.stop)
        return result

    def _encode(
        self,
        feature: VLAFeature,
        *,
        adapters: Mapping[str, LoRAAdapter | None] | None,
        grad: bool,
        times: StageTimes | None,
    ) -> BackboneOutput:
        """The backbone forward of a canonicalized batch, each tenant's rows through its
        adapter (see :meth:`shared_forward`): every row of the output, in ``feature``'s
        order."""
        t1 = time.perf_counter()
        segments: list[LoRASegment] = []
        for entry in feature.slices:
            key = entry.tenant_id
            if adapters is not None and key in adapters:
                adapter = adapters[key]
            else:
                adapter = self.slots[key].lora if key in self.slots else None
            if adapter is not None:
                segments.append(LoRASegment(entry.start, entry.stop, adapter))
        if segments:
            rows = LoRARows(feature.batch_size, tuple(segments), training=grad)
            if any(seg.adapter.sees_images for seg in segments):
                # Vision adapters act on images: give the hooks each row's image count.
                rows = rows.with_images(self.base.images_per_row(feature))
            encode: Callable[..., BackboneOutput] = self.base.encode
            with lora_rows(rows):
                if grad:
                    out = encode(feature, grad=True)
                else:
                    with torch.no_grad():
                        out = encode(feature).detach()
        else:
            with torch.no_grad():
                out = self.base.encode(feature).detach()
        if times is not None:
            times.backbone_s += time.perf_counter() - t1
        return out

    # --- training --------------------------------------------------------------------

    def train_step(
        self,
        batches: Mapping[str, ObservationBatch],
        *,
        action_masks: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, StepResult]:
        """One grouped SFT step (:func:`~joynexus.models.execution.grouped_step.sft_step`): shared
        forward, then an independent update per tenant.

        Args:
            batches: tenant id → its batch (with actions).
            action_masks: Optional per-tenant masks of valid action entries.

        Returns:
            tenant id → its loss, new policy version and gradient norm.

        Raises:
            NotFoundError: an unknown tenant.
            InvalidRequestError: a batch without actions.
            SchemaMismatchError: a batch that does not match its tenant's schema.
        """
        slots = {tid: self.slot(tid) for tid in batches}
        return sft_step(
            slots, batches, forward=self.shared_forward, lock=self._lock, action_masks=action_masks
        )

    def serial_train_step(
        self,
        batches: Mapping[str, ObservationBatch],
        *,
        action_masks: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, StepResult]:
        """The same step, tenant by tenant with one backbone forward each (baseline)."""
        masks = action_masks or {}
        results: dict[str, StepResult] = {}
        for tid, batch in batches.items():
            one = {tid: masks[tid]} if tid in masks else None
            results.update(self.train_step({tid: batch}, action_masks=one))
        return results

    # --- inference -------------------------------------------------------------------

    def _current_slot(self, tenant_id: str, policy_version: int | None) -> TenantSlot:
        slot = self.slot(tenant_id)
        if policy_version is not None and policy_version != slot.policy_version:
            raise ConflictError(
                f"tenant {tenant_id!r}: request pins policy version "
                f"{policy_version}, the serving slot holds {slot.policy_version}",
                tenant_id=tenant_id,
                requested=policy_version,
                available=slot.policy_version,
            )
        return slot

    def run_requests(
        self,
        requests: Sequence[ServeRequest],
        mode: Literal["mean", "sample"] = "mean",
        *,
        resolve_slot: SlotResolver | None = None,
        times: StageTimes | None = None,
        alone: bool = False,
    ) -> list[InferenceResult]:
        """Answer a batch of inference requests with one grouped forward (synchronous).

        Requests of the same tenant are concatenated before canonicalization and split
        again afterwards, so each request gets exactly its own rows. A request's own
        ``mode`` overrides ``mode``. Requests of LoRA tenants batch with everyone's
        (mixed-adapter forward); their rows are grouped per served version, since each
        version has its own adapter. A request that carries its ``slot`` was resolved
        and validated at admission and is neither resolved nor validated here.

        Args:
            requests: The batch.
            mode: Default decode mode.
            resolve_slot: ``(tenant_id, policy_version) -> TenantSlot`` picking the slot
                that decodes a request without one (versioned serving: requests of one
                tenant may name different versions; they share the tenant's rows of the
                forward and are decoded by their own version's slot). Default: the
                registered slot, which must hold the requested version.
            times: Filled with the batch's lock wait and stage seconds.
            alone: Nothing else waits for the model (a lone request). A forward too small
                to split over torch's threads then keeps MKL's own threads for its matrix
                products, which a free second core speeds up (a small Qwen-VL row: 28
                against 41 ms, by a script). Otherwise they run serial too: beside a busy
                core, split products wait for it (the same row: 183 against 41 ms).

        Raises:
            NotFoundError: a request names an unknown tenant.
            ConflictError: a request pins a policy version that is not served.
            SchemaMismatchError: an observation does not match its tenant's schema.
        """
        resolve = resolve_slot or self._current_slot
        # Forward groups: a tenant's rows share the forward across versions, unless the
        # slot has a LoRA adapter (then the version's adapter shapes the features).
        per_tenant: dict[str, list[int]] = {}
        slots: list[TenantSlot] = []
        modes: list[Literal["mean", "sample"]] = []
        for i, req in enumerate(requests):
            slot = req.slot
            if slot is None:
                slot = resolve(req.tenant_id, req.policy_version)
                req.observation.validate(slot.schema)
            slots.append(slot)
            modes.append(req.mode or mode)
            key = req.tenant_id
            if slot.lora is not None:
                key = f"{req.tenant_id}@v{slot.policy_version}#{id(slot)}"
            per_tenant.setdefault(key, []).append(i)
        # Within a tenant, order rows by (version, mode) so each decode group is one
        # contiguous slice of the tenant's backbone rows.
        for idx in per_tenant.values():
            idx.sort(key=lambda i: (slots[i].policy_version, modes[i], i))
        batches = {
            tid: ObservationBatch.concat([requests[i].observation for i in idx])
            for tid, idx in per_tenant.items()
        }
        schemas = {tid: slots[idx[0]].schema for tid, idx in per_tenant.items()}
        adapters = {tid: slots[idx[0]].lora for tid, idx in per_tenant.items()}
        results: list[InferenceResult | None] = [None] * len(requests)
        device = self.base.device
        # Canonicalization reads only the requests (every one validated, at admission or
        # in the loop above), so it runs before the lock: a training step waiting for
        # the backbone never waits for it.
        waited = time.perf_counter()
        feature = self.base.canonicalize(
            [(tid, schemas[tid], b) for tid, b in batches.items()], validated=True
        )
        planning = time.perf_counter()
        # The decode plan, before the lock: within a tenant, each run of requests with
        # one slot and mode is one group of rows of the backbone output. It prepares the
        # heads' inputs (each group's rows and state), so it is metered with the heads.
        plan: list[tuple[list[int], DecodeGroup]] = []
        for key, idx in per_tenant.items():
            start = feature.slice_of(key).start
            state = batches[key].state  # sliced per group in numpy (no torch op)
            row = 0
            k = 0
            while k < len(idx):
                slot, req_mode = slots[idx[k]], modes[idx[k]]
                end = k
                while end < len(idx) and slots[idx[end]] is slot and modes[idx[end]] == req_mode:
                    end += 1
                rows = sum(requests[i].observation.batch_size for i in idx[k:end])
                rows_state = _to_tensor(state[row : row + rows], device)
                planned = DecodeGroup(slot, req_mode, start + row, start + row + rows, rows_state)
                plan.append((idx[k:end], planned))
                row += rows
                k = end
        locked = time.perf_counter()
        # A serving batch: before any training waiting for the lock, and a running step
        # yields to it between its phases (joynexus.utils.priority_lock).
        with self._lock.priority():
            if times is not None:
                times.canonicalize_s += planning - waited
                times.head_s += locked - planning
                times.lock_wait_s += time.perf_counter() - locked
            # Split over torch's threads or run in this thread alone, as the backbone
            # chooses by the recent cost of each way on this machine's load (a split's
            # second share waits for a core that fronts, clients or other jobs may
            # hold), and tell it what this one cost.
            split = self.base.forward_splits(feature)
            with serial_intra_op(not split, blas=not alone):
                began = time.perf_counter()
                out = self._encode(feature, adapters=adapters, grad=False, times=times)
                heads = time.perf_counter()
                self.base.forward_took(feature, split, heads - began)
                decoded_groups = decode_groups([planned for _, planned in plan], out)
            copies = time.perf_counter()
            if times is not None:
                times.head_s += copies - heads
        # Device-to-host copies after the lock: the decoded tensors are this batch's own
        # (a later step on the device's stream cannot overwrite them before they are read).
        for (group, planned), decoded in zip(plan, decoded_groups, strict=True):
            tid, version = requests[group[0]].tenant_id, planned.slot.policy_version
            # One host copy per decode group; each request gets a view of it.
            actions_np = _numpy(decoded.actions)
            assert actions_np is not None
            log_probs_np = _numpy(decoded.log_probs)
            values_np = _numpy(decoded.values)
            chain_np = _numpy(decoded.chain)
            offset = 0
            for i in group:
                n = requests[i].observation.batch_size
                sl = slice(offset, offset + n)
                results[i] = InferenceResult(
                    tenant_id=tid,
                    policy_version=version,
                    actions=actions_np[sl],
                    log_probs=None if log_probs_np is None else log_probs_np[sl],
                    values=None if values_np is None else values_np[sl],
                    chain=None if chain_np is None else chain_np[sl],
                )
                offset += n
        if times is not None:
            times.head_s += time.perf_counter() - copies
        return [r for r in results if r is not None]


def resident_bytes(base_parameters: Iterable[torch.Tensor], slots: Iterable[TenantSlot]) -> int:
    """Resident parameter bytes of a base plus slots, each storage counted once."""
    tensors: list[torch.Tensor] = list(base_parameters)
    for slot in slots:
        tensors.extend(slot.parameters())
    return unique_parameter_bytes(tensors)
