"""openpi's websocket policy protocol in front of the Master's group-batched ``predict``
(:mod:`.gateway`), its msgpack-numpy codec (:mod:`.codec`), the observation key mapping
(:mod:`.observations`) and where it is mounted (:mod:`.app`)."""

from joynexus.server.openpi.app import OPENPI, PATH, openpi_app, router
from joynexus.server.openpi.gateway import OpenPIGateway

__all__ = ["OPENPI", "PATH", "OpenPIGateway", "openpi_app", "router"]
