"""A tenant's own trainable image encoder: conv features read out as spatial keypoints.

Why a head needs one: the shared backbone is frozen, and a frozen *random* backbone
(what tests and CPU runs use) keeps too little of where a small object is for a head to
learn a reach from (docs/RESULTS.md §15.1: a ridge probe finds the goal in its tokens,
no pooling of them let a head use it, and LoRA on the vision tower did not recover it).
The issue's remedy is "a trainable vision projection": this module is that projection,
owned by one tenant like the rest of its action module, reading the same canonical
camera images the backbone saw (``BackboneOutput.images``), so nothing else changes on
the shared path.

The read-out is a spatial softmax (the keypoint layer of end-to-end visuomotor
policies): each of ``keypoints`` feature maps becomes the expected ``(x, y)`` of its
activation, so the head receives *where* things are as numbers, the quantity a reaching
or pushing action is a function of. A pooled feature vector must learn that mapping
from scratch; measured on reach2d from pixels, the keypoints get there in a few hundred
steps.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.nn import functional as F

from joynexus.errors import InvalidRequestError

__all__ = ["ImageEncoderConfig", "SpatialSoftmaxEncoder"]


class ImageEncoderConfig(BaseModel):
    """Hyperparameters of :class:`SpatialSoftmaxEncoder` (``action_module.image_encoder``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(
        default=64,
        ge=16,
        le=512,
        description="Side (px) the canonical camera images are resized to before the "
        "convolutions; small is fast on CPU.",
    )
    channels: int = Field(default=32, ge=4, le=512, description="Width of the conv layers.")
    keypoints: int = Field(
        default=16, ge=1, le=256, description="Feature maps read out as (x, y) keypoints."
    )


class SpatialSoftmaxEncoder(nn.Module):
    """Conv stack shared by the tenant's cameras → ``keypoints`` (x, y) pairs per camera
    → one linear map to ``out_dim``.

    Args:
        config: The encoder's hyperparameters.
        num_cameras: The tenant's cameras; they fill the first canonical slots, in the
            schema's order.
        out_dim: Width of the output (the head's hidden width).
    """

    def __init__(self, config: ImageEncoderConfig, num_cameras: int, out_dim: int):
        super().__init__()
        if num_cameras < 1:
            raise InvalidRequestError(
                "action_module.image_encoder needs a schema with at least one camera",
                field="action_module.image_encoder",
            )
        self.config = config
        self.num_cameras = num_cameras
        c = config.channels
        self.convs = nn.Sequential(
            nn.Conv2d(3, c, 5, stride=2, padding=2),
            nn.GELU(),
            nn.Conv2d(c, c, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(c, config.keypoints, 3, padding=1),
        )
        # Learned softmax temperature (log scale), starting at 1.
        self.log_temperature = nn.Parameter(torch.zeros(()))
        self.out = nn.Linear(num_cameras * config.keypoints * 2, out_dim)

    def keypoints(self, images: torch.Tensor) -> torch.Tensor:
        """The expected ``(x, y)`` in ``[-1, 1]`` of each feature map, ``[B, cams, K, 2]``.

        Args:
            images: ``uint8 [B, slots, 3, S, S]`` canonical images.

        Raises:
            InvalidRequestError: Fewer slots than the tenant's cameras.
        """
        if images.dim() != 5 or int(images.shape[1]) < self.num_cameras:
            raise InvalidRequestError(
                f"the image encoder reads {self.num_cameras} camera slot(s) of "
                f"[B, slots, 3, S, S] images, got shape {list(images.shape)}",
                field="action_module.image_encoder",
            )
        b = int(images.shape[0])
        dtype = self.out.weight.dtype
        pixels = images[:, : self.num_cameras].flatten(0, 1)
        x = pixels.to(device=self.out.weight.device, dtype=dtype) / 255.0 - 0.5
        size = self.config.size
        if x.shape[-1] != size or x.shape[-2] != size:
            x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
        maps = self.convs(x)
        k, h, w = maps.shape[1:]
        prob = torch.softmax(maps.flatten(2) * self.log_temperature.exp(), dim=-1).view(-1, k, h, w)
        xs = torch.linspace(-1.0, 1.0, w, device=maps.device, dtype=maps.dtype)
        # Image rows run top to bottom; +y points up, as in the simulators' frames.
        ys = torch.linspace(1.0, -1.0, h, device=maps.device, dtype=maps.dtype)
        kx = (prob.sum(dim=2) * xs).sum(dim=-1)
        ky = (prob.sum(dim=3) * ys).sum(dim=-1)
        return torch.stack([kx, ky], dim=-1).view(b, self.num_cameras, k, 2)

    def forward(self, images: torch.Tensor | None) -> torch.Tensor:
        """``[B, out_dim]`` from the canonical images.

        Raises:
            InvalidRequestError: No images came with the features (a path that does
                not keep them), or their shape is wrong.
        """
        if images is None:
            raise InvalidRequestError(
                "action_module.image_encoder needs the canonical camera images, and these "
                "features came without them",
                field="action_module.image_encoder",
            )
        out: torch.Tensor = self.out(self.keypoints(images).flatten(1))
        return out
