"""The JoyNexus HTTP server: FastAPI app factory, auth, quotas, wire codecs, routes.

Start at :func:`joynexus.server.app.create_app`. The server never imports torch.
"""

from __future__ import annotations

from joynexus.server.app import API_VERSION, create_app
from joynexus.server.auth import Principal, TenantStore
from joynexus.server.config import ServerConfig, TenantQuotas
from joynexus.server.state import ServerState, ServiceRegistry

__all__ = [
    "API_VERSION",
    "Principal",
    "ServerConfig",
    "ServerState",
    "ServiceRegistry",
    "TenantQuotas",
    "TenantStore",
    "create_app",
]
