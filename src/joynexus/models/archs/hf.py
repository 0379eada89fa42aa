"""Calls into ``transformers`` that every resident architecture shares.

``quiet_transformers`` lives in :mod:`joynexus.models.tiny`, which a side venv loads from
its file alone (it imports nothing of joynexus); it is re-exported here.
"""

from __future__ import annotations

import importlib
from typing import Any

from joynexus.models.tiny import quiet_transformers as quiet_transformers


def hf(module: str = "transformers") -> Any:
    """A ``transformers`` (sub)module, typed ``Any``: the Auto* factories, configs and
    processors take architecture-specific keyword arguments its annotations do not
    describe."""
    return importlib.import_module(module)


__all__ = ["hf", "quiet_transformers"]
