"""The LeRobot reference environment: today's ``lerobot`` (0.6.1) in its own root.

lerobot 0.5 and later need Python >= 3.12, which the project's machines do not have;
``make install`` builds a Debian trixie root with Python 3.13 and a venv holding
``lerobot[smolvla,pi]`` (scripts/install-lerobot-reference.sh), cached outside the
checkout in ``$JOYNEXUS_LEROBOT_REFERENCE`` (default
``~/.cache/joynexus/lerobot-reference``). :func:`run_reference` runs a script of
:mod:`joynexus.interop.side` with that venv's python, chrooted into the root.

Mounts: the command runs under ``unshare -m``, a private mount namespace: ``/proc``,
a ``/dev`` of a few device nodes, the source tree and the folders the caller names
(``binds``, at the same paths inside) are mounted there only, and vanish with the
process. Nothing is ever mounted on the machine itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from joynexus.errors import InvalidRequestError, ServiceUnavailableError

#: Where the root is, when not the default cache folder.
REFERENCE_ENV = "JOYNEXUS_LEROBOT_REFERENCE"
#: The lerobot release the reference environment holds (the install script's pin).
REFERENCE_LEROBOT = "0.6.1"
#: The venv inside the root (its python links to the root's own, absent on the machine).
VENV_PYTHON = "/opt/lerobot/bin/python"
VENV_CFG = "opt/lerobot/pyvenv.cfg"
#: Written by the install script once the root is complete.
STAMP = ".joynexus-reference"
INSTALL = "bash scripts/install-lerobot-reference.sh"
#: The package source (``src/joynexus``'s parent), mounted here inside the root.
SOURCE_MOUNT = "/opt/joynexus-src"
_SOURCE = Path(__file__).resolve().parents[2]

# The mount script: arguments are the root, the source tree, the working folder inside,
# the binds (until "--"), then the command. The binds are mounted at their own paths:
# those under /tmp on a tmpfs over the root's /tmp (nothing is left in the cached root);
# others on folders made in the root (empty, kept).
_ENTER = r"""
set -eu
root="$1"; src="$2"; cwd="$3"; shift 3
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=755 tmpfs "$root/dev"
for node in null zero random urandom; do
  touch "$root/dev/$node"; mount --bind "/dev/$node" "$root/dev/$node"
done
mkdir -p "$root/dev/shm"; mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mkdir -p "$root/opt/joynexus-src"; mount --bind -o ro "$src" "$root/opt/joynexus-src"
while [ "$1" != "--" ]; do
  mkdir -p "$root$1"; mount --bind "$1" "$root$1"; shift
done
shift
exec chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/bin:/bin LANG=C.UTF-8 \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONDONTWRITEBYTECODE=1 \
  OMP_NUM_THREADS=2 /bin/sh -c 'cd "$0" && exec "$@"' "$cwd" "$@"
"""


def reference_root() -> Path:
    """The root folder: ``$JOYNEXUS_LEROBOT_REFERENCE``, else the default cache."""
    env = os.environ.get(REFERENCE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "joynexus" / "lerobot-reference"


def reference_problem() -> str | None:
    """Why the reference environment cannot run here, or ``None`` when it can."""
    root = reference_root()
    if not (root / STAMP).is_file() or not (root / VENV_CFG).is_file():
        return (
            f"the LeRobot reference environment (lerobot {REFERENCE_LEROBOT}, Python 3.13) "
            f"is not built at {root}; build it with `{INSTALL}` as root (make install does) "
            f"or point ${REFERENCE_ENV} at one"
        )
    if os.geteuid() != 0:
        return f"entering the LeRobot reference environment at {root} needs root (chroot)"
    if shutil.which("unshare") is None or shutil.which("chroot") is None:
        return "entering the LeRobot reference environment needs unshare and chroot"
    return None


def side_script(name: str) -> str:
    """The path inside the root of ``joynexus/interop/side/<name>``."""
    return f"{SOURCE_MOUNT}/joynexus/interop/side/{name}"


def run_reference(
    script: str,
    args: list[str],
    *,
    binds: list[Path] | None = None,
    cwd: Path | None = None,
    timeout: float = 900.0,
) -> dict[str, Any]:
    """Run side script ``script`` (a file name in :mod:`joynexus.interop.side`) with
    ``args`` in the reference environment; ``binds``: host folders the script reads or
    writes, visible inside at the same paths; ``cwd``: its working folder (one of
    ``binds`` or below one; default ``/``).

    Returns:
        The JSON object the script prints last.

    Raises:
        ServiceUnavailableError: the environment is not built or cannot be entered here
            (says why and how to build it).
        InvalidRequestError: the script failed (its last stderr lines).
    """
    problem = reference_problem()
    if problem is not None:
        raise ServiceUnavailableError(problem, root=str(reference_root()))
    folders = [str(Path(b).resolve()) for b in binds or []]
    for folder in folders:
        if not Path(folder).is_dir() or folder == "/":
            raise InvalidRequestError(f"reference environment: {folder!r} is not a folder")
    command = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "--fork",
        "sh",
        "-c",
        _ENTER,
        "enter",
        str(reference_root().resolve()),
        str(_SOURCE),
        str(Path(cwd).resolve()) if cwd is not None else "/",
        *folders,
        "--",
        VENV_PYTHON,
        side_script(script),
        *args,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise InvalidRequestError(
            f"lerobot {REFERENCE_LEROBOT} (reference environment) failed: "
            f"{proc.stderr.strip()[-1500:]}",
            command=args[:1],
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise InvalidRequestError(f"lerobot {REFERENCE_LEROBOT} printed no result")
    result: dict[str, Any] = json.loads(lines[-1])
    return result
