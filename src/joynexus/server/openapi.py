"""The published OpenAPI document, for the committed snapshot ``docs/openapi.json``.

Regenerate the snapshot after a deliberate API change with::

    python -m joynexus.server.openapi > docs/openapi.json
"""

from __future__ import annotations

import json
import sys
from typing import Any


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of a server with default configuration."""
    # Imported here: building the in-memory services pulls in torch (Training Queue);
    # the document itself depends only on the routes.
    from joynexus.control.scheduler import TrainingScheduler
    from joynexus.queues.training import TrainingQueue
    from joynexus.server.app import create_app
    from joynexus.server.auth import TenantStore
    from joynexus.server.routers import live_routers
    from joynexus.server.state import ServiceRegistry
    from joynexus.services.environment import EnvironmentService

    app = create_app(
        services=ServiceRegistry(
            tenants=TenantStore.in_memory(),
            scheduler=TrainingScheduler.in_memory(),
            training_queue=TrainingQueue(),
            environment=EnvironmentService(),
        ),
        # Exactly the routers joynexus serve mounts over a live Master.
        extra_routers=live_routers(),
    )
    return app.openapi()


def render(document: dict[str, Any]) -> str:
    """The snapshot's exact text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(openapi_document()))
