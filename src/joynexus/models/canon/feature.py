"""VLAFeature: the canonical, padded, masked backbone input of many tenants at once.

Most VLA backbones are pretrained on one unified data prototype (paper §4.3, Figure 8):
fixed camera slots at one image size plus a tokenized instruction. That prototype is
the point where samples of different tenants — with different cameras, state and action
spaces — can be concatenated into one batch for one shared forward pass. The slice table
records which rows belong to which tenant so the backbone output can be split back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from joynexus.errors import InvalidRequestError


@dataclass(frozen=True)
class SliceEntry:
    """Rows ``[start, stop)`` of a grouped batch belong to ``tenant_id``."""

    tenant_id: str
    schema_signature: str
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass
class VLAFeature:
    """The canonical backbone input of a (possibly multi-tenant) batch.

    Attributes:
        model_inputs: Exactly what the backbone forward takes (``input_ids``,
            ``attention_mask``, ``pixel_values`` and the architecture's extras such as
            ``image_grid_thw``, ``mm_token_type_ids`` or ``pixel_attention_mask``),
            already on the backbone's device. Text is LEFT-padded, so the last position
            of every row is its last real token.
        state: ``float32 [B, max_state_dim]`` robot state, zero-padded on the right to
            the widest state among the grouped tenants.
        state_mask: ``bool [B, max_state_dim]``, True at each row's real state dims.
        camera_mask: ``bool [B, num_camera_slots]``, False where a slot holds the blank
            image of a camera the tenant does not have.
        slices: The slice table, in row order, one entry per tenant.
        images: The canonical camera images ``uint8 [B, slots, 3, S, S]`` the inputs
            were laid out from (heads with an image encoder of their own read them).
        blank_plan: Which images the vision tower encodes when blank slots share one
            pass, set by the backbone that canonicalized the batch
            (:func:`joynexus.models.archs.qwen_vl.vision_share.blank_plan`); ``None``: every image.
    """

    model_inputs: dict[str, torch.Tensor]
    state: torch.Tensor
    state_mask: torch.Tensor
    camera_mask: torch.Tensor
    slices: list[SliceEntry] = field(default_factory=list)
    images: torch.Tensor | None = None
    blank_plan: tuple[list[int], list[int]] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.state.shape[0])

    @property
    def tenant_ids(self) -> list[str]:
        return [s.tenant_id for s in self.slices]

    def slice_of(self, tenant_id: str) -> SliceEntry:
        """The slice-table entry of ``tenant_id``.

        Raises:
            InvalidRequestError: When the tenant has no rows in this batch.
        """
        for entry in self.slices:
            if entry.tenant_id == tenant_id:
                return entry
        raise InvalidRequestError(
            f"tenant {tenant_id!r} has no rows in this batch; tenants present: {self.tenant_ids}",
            tenant_id=tenant_id,
        )

    def split(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split a per-row tensor (first dim ``B``) back into each tenant's rows (views).

        Raises:
            InvalidRequestError: When ``x``'s first dimension is not the batch size.
        """
        if x.dim() == 0 or int(x.shape[0]) != self.batch_size:
            raise InvalidRequestError(
                f"split: expected a tensor with first dimension {self.batch_size} "
                f"(the batch size), got shape {list(x.shape)}",
                expected=self.batch_size,
                shape=list(x.shape),
            )
        return {s.tenant_id: x[s.start : s.stop] for s in self.slices}


def max_abs_diff_left_padded(
    a: torch.Tensor,
    a_mask: torch.Tensor,
    b: torch.Tensor,
    b_mask: torch.Tensor,
    *,
    right_padded: bool = False,
) -> float:
    """Largest ``|a - b|`` over positions that are real tokens in both.

    ``a`` and ``b`` are ``[N, L, D]`` hidden states of the same N samples, left-padded to
    possibly different lengths (e.g. a grouped and a serial batch). Left padding aligns
    real tokens at the right end, so rows are compared right-aligned; ``right_padded``
    inputs (a SmolVLA prefix) are compared left-aligned.

    Raises:
        ValueError: When the row counts differ or the real-token masks disagree.
    """
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"row counts differ: {a.shape[0]} vs {b.shape[0]}")
    n = min(int(a.shape[1]), int(b.shape[1]))
    cut = slice(None, n) if right_padded else slice(-n, None)
    a_t, b_t = a[:, cut].float(), b[:, cut].float()
    am, bm = a_mask[:, cut].bool(), b_mask[:, cut].bool()
    total = int(am.sum())
    if (
        not torch.equal(am, bm)
        or total != int(a_mask.bool().sum())
        or total != int(b_mask.bool().sum())
    ):
        raise ValueError("the two batches do not hold the same real tokens per row")
    if total == 0:
        return 0.0
    return float((a_t - b_t).abs()[am].max())
