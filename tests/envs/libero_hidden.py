"""Hide every LIBERO asset source, as on a fresh clone with no pack beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from joynexus.envs import libero_setup


def hide_libero_assets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No ``$JOYNEXUS_LIBERO_ASSETS``, no ``../shared/libero``, no hf-libero assets next
    to its package or in its download cache; returns the fake home directory."""
    monkeypatch.delenv(libero_setup.ASSETS_ENV_VAR, raising=False)
    clone = tmp_path / "fresh-clone" / "main"
    clone.mkdir(parents=True)
    monkeypatch.setattr(libero_setup, "_repo_root", lambda: clone)
    site = tmp_path / "site-packages" / "libero" / "libero"
    site.mkdir(parents=True)
    monkeypatch.setattr(libero_setup, "_package_dir", lambda: site)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home
