"""Where the services and workflow loops run: the embedded in-process runtime."""

from __future__ import annotations

from joynexus.runtime.embedded import EmbeddedRuntime, RuntimeConfig, load_base_model

__all__ = ["EmbeddedRuntime", "RuntimeConfig", "load_base_model"]
