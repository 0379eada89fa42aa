"""Tensor containers shared by the backbone, the action modules and the executors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

import torch

E = TypeVar("E")


@runtime_checkable
class HostsExtensions(Protocol):
    """A resident base model that hands a policy family the typed extension it needs
    (a π0 checkpoint's expert template, a SmolVLA checkpoint...)."""

    model_id: str
    arch: str

    def extension(self, kind: type[E]) -> E | None:
        """The resident architecture's extension if it is a ``kind``, else ``None``."""
        ...


def extension_of(base: object, kind: type[E]) -> E | None:
    """``base``'s extension of type ``kind`` (``None`` when ``base`` has none of it,
    or hosts no extensions at all, as a test's stand-in base model)."""
    return base.extension(kind) if isinstance(base, HostsExtensions) else None


def describe_base(base: object) -> str:
    """``'<model id>' is '<arch>'`` of a resident base model, for messages."""
    if isinstance(base, HostsExtensions):
        return f"{base.model_id!r} is {base.arch!r}"
    return "is no resident base model"


@dataclass(frozen=True)
class BackboneOutput:
    """What the resident base model hands to tenant action modules.

    Attributes:
        hidden_states: ``[B, L, D]`` last hidden state of the backbone.
        attention_mask: ``[B, L]`` 1 where ``hidden_states`` holds a real token, 0 at
            padding. Heads must ignore padded positions.
        layers: Optional chosen intermediate layers, each ``[B, L, D]``, keyed by
            layer index (for heads that read more than the last layer).
        prefix_kv: A π0 prefix's KV cache, one ``(keys, values)`` pair per decoder
            layer, each ``[B, kv_heads, L, head_dim]`` (positions aligned with
            ``attention_mask``), for action experts that attend to it; else ``None``.
        images: The canonical camera images the backbone saw, ``uint8
            [B, slots, 3, S, S]`` (resized-with-pad, absent cameras blank; in host
            memory, a head that reads them moves them), for heads with a trainable
            image encoder of their own; ``None`` when not kept.
    """

    hidden_states: torch.Tensor
    attention_mask: torch.Tensor
    layers: dict[int, torch.Tensor] | None = None
    prefix_kv: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None
    images: torch.Tensor | None = None

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
        kv = None
        if self.prefix_kv is not None:
            kv = tuple((k[start:stop], v[start:stop]) for k, v in self.prefix_kv)
        return BackboneOutput(
            hidden_states=self.hidden_states[start:stop],
            attention_mask=self.attention_mask[start:stop],
            layers=layers,
            prefix_kv=kv,
            images=None if self.images is None else self.images[start:stop],
        )

    def take(self, rows: Sequence[int]) -> BackboneOutput:
        """The rows ``rows``, in that order (a copy)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.hidden_states.device)
        layers = None
        if self.layers is not None:
            layers = {k: v[index] for k, v in self.layers.items()}
        kv = None
        if self.prefix_kv is not None:
            kv = tuple((k[index], v[index]) for k, v in self.prefix_kv)
        return BackboneOutput(
            hidden_states=self.hidden_states[index],
            attention_mask=self.attention_mask[index],
            layers=layers,
            prefix_kv=kv,
            images=None if self.images is None else self.images[index.to(self.images.device)],
        )

    def detach(self) -> BackboneOutput:
        """The same features cut from the autograd graph (the base is frozen)."""
        layers = None
        if self.layers is not None:
            layers = {k: v.detach() for k, v in self.layers.items()}
        kv = None
        if self.prefix_kv is not None:
            kv = tuple((k.detach(), v.detach()) for k, v in self.prefix_kv)
        return BackboneOutput(
            hidden_states=self.hidden_states.detach(),
            attention_mask=self.attention_mask.detach(),
            layers=layers,
            prefix_kv=kv,
            images=self.images,
        )
