from tests.server.livesrv import reach_demos, tiny_model  # noqa: F401  (live-server fixtures)
