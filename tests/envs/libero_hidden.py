"""Hide LIBERO's asset sources, as on a fresh clone.

``hide_libero_pack``: no ``$JOYNEXUS_LIBERO_ASSETS`` and no ``../shared/libero`` — a fresh
clone after the project's install, whose registry asset packages remain.
``hide_libero_assets``: that, and no registry packages and no hf-libero assets either —
a machine where nothing brought LIBERO's scene assets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from joynexus.envs import libero_setup


def hide_libero_pack(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No asset pack (no environment variable, no ``../shared/libero`` beside the
    checkout); returns the fake clone's root."""
    monkeypatch.delenv(libero_setup.ASSETS_ENV_VAR, raising=False)
    clone = tmp_path / "fresh-clone" / "main"
    clone.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(libero_setup, "_repo_root", lambda: clone)
    return clone


def hide_libero_assets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No pack, no registry asset packages, no hf-libero assets next to its package or in
    its download cache; returns the fake home directory."""
    hide_libero_pack(monkeypatch, tmp_path)
    monkeypatch.setattr(libero_setup, "_registry_package_dir", lambda: None)
    site = tmp_path / "site-packages" / "libero" / "libero"
    site.mkdir(parents=True)
    monkeypatch.setattr(libero_setup, "_package_dir", lambda: site)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home
