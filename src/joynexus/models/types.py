"""Tensor containers shared by the backbone, the action modules and the executors."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BackboneOutput:
    """What the resident base model hands to tenant action modules.

    Attributes:
        hidden_states: ``[B, L, D]`` last hidden state of the backbone.
        attention_mask: ``[B, L]`` 1 where ``hidden_states`` holds a real token, 0 at
            padding. Heads must ignore padded positions.
        layers: Optional chosen intermediate layers, each ``[B, L, D]``, keyed by
            layer index (for heads that read more than the last layer).
    """

    hidden_states: torch.Tensor
    attention_mask: torch.Tensor
    layers: dict[int, torch.Tensor] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.hidden_states.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.hidden_states.shape[-1])

    def rows(self, start: int, stop: int) -> BackboneOutput:
        """The sub-batch ``[start:stop]`` (a view, no copy)."""
        layers = None
        if self.layers is not None:
            layers = {k: v[start:stop] for k, v in self.layers.items()}
        return BackboneOutput(
            hidden_states=self.hidden_states[start:stop],
            attention_mask=self.attention_mask[start:stop],
            layers=layers,
        )

    def detach(self) -> BackboneOutput:
        """The same features cut from the autograd graph (the base is frozen)."""
        layers = None
        if self.layers is not None:
            layers = {k: v.detach() for k, v in self.layers.items()}
        return BackboneOutput(
            hidden_states=self.hidden_states.detach(),
            attention_mask=self.attention_mask.detach(),
            layers=layers,
        )
