"""Entry point of the ``joynexus`` command: imports every command module."""

from __future__ import annotations

from joynexus.cli import control  # noqa: F401  (registers its commands)
from joynexus.cli.app import app

__all__ = ["app"]


if __name__ == "__main__":  # pragma: no cover
    app()
