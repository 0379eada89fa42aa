"""Decoding a grouped forward's rows: each slot's head, or one pass for the heads of many
tenants that share an architecture.

After the one backbone forward of a serving batch, every tenant's head decodes its own
rows. Small heads cost more in per-call Python than in arithmetic, so the decodes of
heads with equal :meth:`TenantSlot.group_key` run as one stacked pass per mode
(:meth:`PolicyHead.predict_group`, :meth:`PolicyHead.sample_group`); heads without a key
decode slot by slot.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.types import BackboneOutput

__all__ = ["DecodeGroup", "Decoded", "decode_groups", "decode_slot"]


@dataclass(frozen=True)
class Decoded:
    """One slot's decode of its rows (tensors; ``InferenceResult`` holds numpy)."""

    actions: torch.Tensor
    log_probs: torch.Tensor | None
    values: torch.Tensor | None
    chain: torch.Tensor | None = None


@dataclass(frozen=True)
class DecodeGroup:
    """Rows ``[start, stop)`` of a batch's backbone output that one slot decodes in one
    mode, with their robot state (``[stop - start, state_dim]``)."""

    slot: TenantSlot
    mode: Literal["mean", "sample"]
    start: int
    stop: int
    state: torch.Tensor


def decode_slot(
    slot: TenantSlot,
    features: BackboneOutput,
    state: torch.Tensor,
    mode: Literal["mean", "sample"],
    generator: torch.Generator | None,
) -> Decoded:
    """One slot decodes its rows: actions, log-probs and chain in ``"sample"`` mode,
    values with a critic."""
    if mode == "sample":
        drawn = slot.sample(features, state, generator=generator)
        return Decoded(drawn.actions, drawn.log_probs, slot.value(features, state), drawn.chain)
    actions = slot.predict(features, state, generator=generator)
    return Decoded(actions, None, slot.value(features, state))


def decode_groups(groups: Sequence[DecodeGroup], features: BackboneOutput) -> list[Decoded]:
    """Decode every group's rows of ``features``.

    Groups of one mode whose slots share a group key (two or more) are decoded in one
    stacked pass, a sampling slot's rows drawn from its own inference generator; each
    slot's critic, if any, still reads its own rows. Everything else decodes slot by
    slot with the slot's inference generator.

    Returns:
        One :class:`Decoded` per group, in order.
    """
    out: list[Decoded | None] = [None] * len(groups)
    stacked: dict[Hashable, list[int]] = {}
    alone: list[int] = []
    for i, group in enumerate(groups):
        key = group.slot.group_key()
        if key is None:
            alone.append(i)
        else:
            stacked.setdefault((group.mode, key), []).append(i)
    for members in stacked.values():
        if len(members) == 1:
            alone.extend(members)
            continue
        rows: list[int] = []
        owner: list[int] = []
        for k, i in enumerate(members):
            span = range(groups[i].start, groups[i].stop)
            rows.extend(span)
            owner.extend([k] * len(span))
        feats = features if rows == list(range(features.batch_size)) else features.take(rows)
        states = torch.cat([groups[i].state for i in members])
        slots = [groups[i].slot for i in members]
        log_probs: torch.Tensor | None = None
        if groups[members[0]].mode == "sample":
            actions, log_probs = TenantSlot.sample_group(slots, feats, states, owner)[:2]
        else:
            actions = TenantSlot.predict_group(slots, feats, states, owner)
        offset = 0
        for i in members:
            group = groups[i]
            n = group.stop - group.start
            values = None
            if group.slot.value_head is not None:
                values = group.slot.value(features.rows(group.start, group.stop), group.state)
            rows_of = slice(offset, offset + n)
            out[i] = Decoded(
                actions[rows_of], None if log_probs is None else log_probs[rows_of], values
            )
            offset += n
    for i in alone:
        group = groups[i]
        out[i] = decode_slot(
            group.slot,
            features.rows(group.start, group.stop),
            group.state,
            group.mode,
            group.slot.inference_generator,
        )
    return [d for d in out if d is not None]
