"""Qwen-VL's 3-D rope positions, computed once per prompt.

Before each forward, Qwen-VL's ``get_rope_index`` walks every row in Python (a group-by
over its token types, a small tensor per image and per text run), about 2 ms of an 11 ms
forward for a batch of eight rows of the tiny model, all of it holding the GIL. A row's
positions depend only on its own unpadded tokens and its images' grids, and a policy's
requests repeat one prompt and one canonical grid, so :func:`install` keeps each row's
positions, as the model's own ``get_rope_index`` computes them for that row alone, and
places them into the batch (padding at position 0, as the model does).
"""

from __future__ import annotations

from typing import Any

import torch

from joynexus.models.vision_share import QWEN_ARCHES

#: Rows kept per model (a bounded cache: cleared when full).
MAX_ROWS = 4096
_IMAGE = 1  # mm_token_type_ids of an image token


def install(model: torch.nn.Module, arch: str) -> bool:
    """Cache the rope positions of ``model`` (a Qwen-VL base model) per row; ``False``
    (nothing changed) for another architecture."""
    original = getattr(model, "compute_3d_position_ids", None)
    rope_index = getattr(model, "get_rope_index", None)
    if arch not in QWEN_ARCHES or original is None or rope_index is None:
        return False
    rows: dict[bytes, torch.Tensor] = {}

    def compute_3d_position_ids(**kwargs: Any) -> torch.Tensor | None:
        ids = kwargs.get("input_ids")
        types = kwargs.get("mm_token_type_ids")
        grid = kwargs.get("image_grid_thw")
        cache = kwargs.get("cache")
        if (
            ids is None
            or types is None
            or grid is None
            or kwargs.get("video_grid_thw") is not None
            or (cache is not None and cache.get_seq_length() > 0)
        ):
            plain: torch.Tensor | None = original(**kwargs)
            return plain
        mask = kwargs.get("attention_mask")
        keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        # One copy of the small integer inputs (the model's own walk reads them row by row).
        ids_c, types_c, keep_c, grid_c = (t.cpu() for t in (ids, types, keep, grid))
        starts = (types_c == _IMAGE) & keep_c
        starts[:, 1:] &= ~((types_c[:, :-1] == _IMAGE) & keep_c[:, :-1])
        per_row = starts.sum(dim=1).tolist()
        out = torch.zeros((3, *ids.shape), dtype=ids.dtype)
        deltas = []
        first = 0
        for b, images in enumerate(per_row):
            row_ids, row_types = ids_c[b][keep_c[b]], types_c[b][keep_c[b]]
            row_grid = grid_c[first : first + images]
            first += images
            key = b"|".join(t.numpy().tobytes() for t in (row_ids, row_types, row_grid))
            pos = rows.get(key)
            if pos is None:
                with torch.no_grad():
                    one, _ = rope_index(
                        row_ids[None],
                        mm_token_type_ids=row_types[None],
                        image_grid_thw=row_grid,
                        attention_mask=None,
                    )
                pos = one[:, 0].to(ids.dtype)
                if len(rows) >= MAX_ROWS:
                    rows.clear()
                rows[key] = pos
            out[:, b, keep_c[b]] = pos
            deltas.append(int(pos.max()) + 1 - int(row_ids.shape[0]))
        # What the model's own path leaves for generation (unused by a frozen encoder).
        model.rope_deltas = torch.tensor(deltas, device=ids.device).unsqueeze(1)
        return out.to(ids.device)

    # An attribute of this instance shadows the class's method for this model only.
    model.compute_3d_position_ids = compute_3d_position_ids  # type: ignore[assignment]
    return True


__all__ = ["MAX_ROWS", "install"]
