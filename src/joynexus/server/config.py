"""Server configuration and per-tenant quotas (plain pydantic data, no services)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ServerConfig", "TenantQuotas"]


class TenantQuotas(BaseModel):
    """Limits one tenant runs under; exceeding one answers 429 with its ``reason``.

    Args:
        max_sessions: Open (or starting) environment sessions.
        max_inflight_jobs: Nonterminal training jobs in the Training Scheduler.
        max_queue_bytes: Bytes held in the Training Queue partitions the tenant owns.
        requests_per_s: Sustained request rate (token-bucket refill rate).
        burst: Requests allowed at once on top of the sustained rate (bucket size).
        max_pending_futures: Long operations submitted and not finished yet.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_sessions: int = Field(default=4, ge=0, le=1024)
    max_inflight_jobs: int = Field(default=64, ge=0, le=1_000_000)
    max_queue_bytes: int = Field(default=2 << 30, ge=0)
    requests_per_s: float = Field(default=200.0, gt=0)
    burst: int = Field(default=400, ge=1)
    max_pending_futures: int = Field(default=16, ge=0, le=10_000)


class ServerConfig(BaseModel):
    """What the HTTP server enforces on every request.

    Args:
        default_quotas: Quotas of tenants created without their own.
        max_body_bytes: Largest request body read (413 above it).
        max_tensor_bytes: Largest single tensor in a body.
        max_long_poll_s: Upper bound on ``?wait=`` of future polls and lease waits.
        future_retention_s: How long a finished future's result stays readable.
        max_futures_per_tenant: Futures (pending + finished, retained) per tenant.
        denied_env_kinds: Environment kinds tenants may not open over HTTP. ``remote``
            is denied by default because it makes the server connect to a URL the
            tenant chooses.
        expose_docs: Serve the interactive docs at ``/docs`` (the schema is always at
            ``/openapi.json``).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    default_quotas: TenantQuotas = Field(default_factory=TenantQuotas)
    max_body_bytes: int = Field(default=256 << 20, gt=0)
    max_tensor_bytes: int = Field(default=128 << 20, gt=0)
    max_long_poll_s: float = Field(default=30.0, ge=0)
    future_retention_s: float = Field(default=3600.0, gt=0)
    max_futures_per_tenant: int = Field(default=256, ge=1)
    denied_env_kinds: list[str] = Field(default_factory=lambda: ["remote"])
    expose_docs: bool = True
