"""What a caller puts into the Inference Queue, and the callables the queue is given."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchFn", "InferenceRequest", "ValidateFn"]


@dataclass(slots=True)
class InferenceRequest:
    """One prediction request: an observation batch from one session of one tenant.

    Args:
        tenant_id: Tenant whose action module decodes the result.
        session_id: Environment session (or API call) the result goes back to.
        schema_signature: The tenant's model-facing interface.
        policy_version: Tenant policy version to decode with (``None``: current).
        observation: The payload, handed to the batch function untouched.
        num_samples: Samples this request contributes to a batch (its observation
            batch size); B is counted in samples.
        compat_key: Shared frozen-prefix compatibility key; only requests with equal
            keys share a batch. Keyword-only and required, so callers choose it
            deliberately (usually :func:`joynexus.models.schema.prefix_key`).
        deadline_s: Longest time the request may wait in the queue, in seconds from
            ``enqueue``; ``None`` means no limit.
    """

    tenant_id: str
    session_id: str
    schema_signature: str
    policy_version: int | None
    observation: Any
    num_samples: int = 1
    compat_key: str = field(kw_only=True)
    deadline_s: float | None = field(default=None, kw_only=True)


BatchFn = Callable[[list[InferenceRequest]], Awaitable[Sequence[Any]]]
"""Runs one batch; returns one result per request, in request order."""

ValidateFn = Callable[[InferenceRequest], None] | None
"""Raises to reject one request (it then fails alone); returns None to accept it."""
