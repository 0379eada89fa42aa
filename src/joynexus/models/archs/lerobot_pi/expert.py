"""What the π0 and π0.5 experts of a LeRobot checkpoint compute alike: the flow time's
sine-cosine embedding and the additive mask of a suffix over the cached prefix.

Both as lerobot 0.6.1 computes them: the embedding in float64 (its
``create_sinusoidal_pos_embedding`` on the CPU) returned in the time's dtype; the mask
``0`` where a suffix token sees a key and openpi's large negative value elsewhere.
"""

from __future__ import annotations

import math

import torch

from joynexus.models.archs.lerobot_pi.checkpoint import MASKED


def time_embedding(
    t: torch.Tensor, width: int, min_period: float, max_period: float
) -> torch.Tensor:
    """Sine-cosine embedding ``[B, width]`` of times ``t`` ``[B]``, computed in float64
    (periods from ``min_period`` to ``max_period``) and returned in ``t``'s dtype."""
    fraction = torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (1.0 / period * 2 * math.pi)[None, :] * t[:, None].double()
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).to(t.dtype)


def suffix_attention(
    prefix: torch.Tensor, sees: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The additive mask and positions of a suffix over a cached prefix.

    Args:
        prefix: ``[B, P]`` the prefix's valid tokens (bool).
        sees: ``[S, S]`` which suffix token (row) sees which (column).
        dtype: The mask's dtype.

    Returns:
        The mask ``[B, 1, S, P + S]`` (every suffix token sees every valid prefix
        token) and the positions ``[B, S]``, continuing after the valid prefix tokens.
    """
    rows, length = int(prefix.shape[0]), int(sees.shape[0])
    seen = torch.cat([prefix[:, None, :].expand(rows, length, -1), sees.expand(rows, -1, -1)], 2)
    mask = torch.zeros(seen.shape, dtype=dtype, device=prefix.device)
    mask = mask.masked_fill(~seen, MASKED)[:, None]
    offsets = prefix.long().sum(dim=1, keepdim=True)
    positions = offsets + torch.arange(length, device=prefix.device)[None, :]
    return mask, positions
