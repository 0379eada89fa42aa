"""Where a served tenant's SFT datasets live: its own folder under each dataset root.

On a shared server a spec's ``dataset.path`` names one of the tenant's *own* datasets,
``<root>/<tenant>/<path>``, relative to that folder (``pusht-demos``, ``2024/run-3``).
The roots are the operator's (``serve --dataset-root``, then the run directory's
``datasets/``); a tenant never reaches past its folder:

* ``..`` parts are refused, and so is an absolute path outside the tenant's folders
  (an absolute path inside one is what a stored spec holds once placed, so a
  restarted server finds it again);
* no symbolic link is followed, at any level under the root (the tenant's folder,
  every folder of the path, every file and folder inside the dataset): each part is
  looked at with ``lstat`` and a link is refused, so a link can neither lead into
  another tenant's folder nor to a server file;
* the roots are searched in order; a dataset found in none is *missing*: a workload
  with a scripted expert records it into the tenant's folder of the last root (the
  server's own), otherwise the spec is refused like an unknown id (404), the same
  answer whether or not another tenant has a dataset of that name;
* looking up creates nothing (no folder, no record): only a recording, once the
  workload starts, writes;
* every message names the path as the tenant wrote it, never a server path.

A single-user ``joynexus run`` reads local paths as written (``MasterLimits.
tenant_datasets`` false) and does not come here.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from joynexus.errors import DatasetError, JoyNexusError, NotFoundError, SpecError

__all__ = [
    "PlacedDataset",
    "in_tenant_terms",
    "not_found",
    "place_tenant_dataset",
    "refuse_links",
    "tenant_view",
]

_FIELD = "dataset.path"
_DETAILS: dict[str, object] = {"field": _FIELD, "fields": [_FIELD]}
_HOW = (
    "name one of your own datasets by a path relative to your dataset folder, such as "
    "'pusht-demos' (no '..', no absolute path)"
)


@dataclass(frozen=True, slots=True)
class PlacedDataset:
    """A tenant's dataset path resolved on this server.

    Attributes:
        written: The path as the tenant wrote it (what messages show).
        path: Where it is (or, when missing, would be recorded) on this server.
        exists: Whether the dataset folder is at ``path``.
    """

    written: str
    path: Path
    exists: bool


def place_tenant_dataset(
    written: Path | str, tenant_id: str, roots: Sequence[Path]
) -> PlacedDataset:
    """Resolve the dataset ``written`` names for ``tenant_id`` (see module docstring).

    Args:
        written: The spec's ``dataset.path``.
        tenant_id: The authenticated tenant.
        roots: The server's dataset roots, searched in order (the last one receives
            recordings).

    Raises:
        SpecError: ``written`` leaves the tenant's folder, or no root is configured.
        DatasetError: a part of the path, or a file inside the dataset, is a symbolic
            link.
    """
    text = str(written)
    if not roots:
        raise SpecError(
            f"{_FIELD} {text!r}: this server reads no datasets (it has no dataset root)",
            **_DETAILS,
        )
    folders = [Path(r).resolve() / tenant_id for r in roots]
    parts = _relative_parts(text, folders)
    for folder in folders:
        found = _walk(folder, parts, text)
        if found is not None:
            if not found.is_dir():
                raise DatasetError(f"{_FIELD} {text!r} is a file, not a dataset folder", **_DETAILS)
            refuse_links(found, text)
            return PlacedDataset(text, found, True)
    return PlacedDataset(text, folders[-1].joinpath(*parts), False)


def refuse_links(dataset: Path, written: str) -> None:
    """Refuse a dataset holding a symbolic link anywhere inside it.

    Raises:
        DatasetError: the first link found, named under ``written``.
    """
    stack = [dataset]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            raise DatasetError(
                f"{_FIELD} {written!r}: cannot list {tenant_view(folder, dataset, written)} "
                f"({exc.strerror})",
                **_DETAILS,
            ) from None
        for entry in entries:
            if entry.is_symlink():
                raise _link_error(written, tenant_view(Path(entry.path), dataset, written))
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))


def tenant_view(path: Path, dataset: Path, written: str) -> str:
    """``path`` (inside ``dataset``) as the tenant sees it: under ``written``."""
    try:
        rel = path.relative_to(dataset)
    except ValueError:
        return written
    return written if rel == Path() else str(PurePosixPath(written) / rel.as_posix())


def in_tenant_terms(exc: JoyNexusError, placed: PlacedDataset) -> JoyNexusError:
    """``exc`` with the server's path of the dataset replaced by the tenant's."""
    server = str(placed.path)

    def scrub(value: object) -> object:
        if isinstance(value, str):
            return value.replace(server, placed.written)
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items()}
        return value

    out = type(exc)(str(scrub(exc.message)))
    out.details = {k: scrub(v) for k, v in exc.details.items()}
    return out


def _relative_parts(text: str, folders: Sequence[Path]) -> tuple[str, ...]:
    path = Path(text)
    if path.is_absolute():
        # A stored (already placed) spec: inside one of this tenant's folders only. The
        # answer for any other absolute path never depends on what exists there.
        for folder in folders:
            if path.is_relative_to(folder) and path != folder:
                path = path.relative_to(folder)
                break
        else:
            raise SpecError(f"{_FIELD} {text!r}: {_HOW}", **_DETAILS)
    parts = tuple(p for p in path.parts if p not in ("", "."))
    if not parts or ".." in parts:
        raise SpecError(f"{_FIELD} {text!r}: {_HOW}", **_DETAILS)
    return parts


def _walk(folder: Path, parts: tuple[str, ...], written: str) -> Path | None:
    """``folder / parts`` when it exists, every part (``folder`` too) no link; None when
    a part is missing."""
    here = folder
    for i, part in enumerate((None, *parts)):
        if part is not None:
            here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DatasetError(
                f"{_FIELD} {written!r}: cannot read it ({exc.strerror})", **_DETAILS
            ) from None
        if stat.S_ISLNK(st.st_mode):
            shown = "your dataset folder" if part is None else "/".join(parts[:i])
            raise _link_error(written, shown)
        if i < len(parts) and not stat.S_ISDIR(st.st_mode):
            return None  # a file where a folder of the path should be: not a dataset
    return here


def _link_error(written: str, shown: str) -> DatasetError:
    return DatasetError(
        f"{_FIELD} {written!r}: {shown!r} is a symbolic link; links are not followed in "
        "datasets on this server (copy the files into your dataset folder)",
        **_DETAILS,
    )


def not_found(placed: PlacedDataset, tenant_id: str) -> NotFoundError:
    """The answer to a dataset the tenant does not have (and cannot record here)."""
    return NotFoundError(
        f"{_FIELD} {placed.written!r}: you (tenant {tenant_id!r}) have no dataset of that "
        "name on this server; give it a path to one of your datasets, or an 'env' of a "
        "kind with a scripted expert so the server records it",
        **_DETAILS,
    )
