from tests.server.livesrv import tiny_model  # noqa: F401  (live-server fixtures)
