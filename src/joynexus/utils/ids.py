"""Identifiers handed to tenants: random tokens, never a counter.

A counter in an id (``job-1``, ``job-2``) tells every tenant how much work the others
submit and lets it guess their ids; records keep their own ordering fields
(``created_seq``, a workload's ``seq``) for whatever needs an order.
"""

from __future__ import annotations

import secrets

__all__ = ["random_id"]


def random_id(prefix: str, nbytes: int = 12) -> str:
    """``<prefix>-<2 * nbytes hex digits>`` from the OS's cryptographic source."""
    return f"{prefix}-{secrets.token_hex(nbytes)}"
