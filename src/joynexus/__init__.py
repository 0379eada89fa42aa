"""JoyNexus: a multi-tenant post-training service for Vision-Language-Action models.

Tenants share one resident, frozen vision-language backbone; each owns its action
module, optimizer, policy version, environment sessions and checkpoints. See
``docs/ARCHITECTURE.md`` for the component map.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("joynexus")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["AsyncClient", "Client", "__version__"]


def __getattr__(name: str) -> object:
    # ``joynexus.Client`` without importing httpx (or the server) for every user.
    if name in ("Client", "AsyncClient"):
        from joynexus import client

        return getattr(client, name)
    raise AttributeError(f"module 'joynexus' has no attribute {name!r}")
