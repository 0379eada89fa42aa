"""Routers, one per concern; :func:`joynexus.server.app.create_app` mounts them."""
