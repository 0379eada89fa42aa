"""Side venvs: packages whose pins clash with the project venv get their own venv next to
it (``make install`` builds them through scripts/install-python-extras.sh)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: The source checkout's root (src/joynexus/interop/ -> root).
_CHECKOUT = Path(__file__).resolve().parents[3]


def side_python(name: str, env_var: str) -> Path:
    """The python of side venv ``name`` (e.g. ``.venv-openpi``).

    ``$<env_var>``, else ``name`` in the source checkout, else next to the running venv;
    the first candidate when none exists (callers say it is missing and how to build it).
    """
    env = os.environ.get(env_var)
    candidates = [Path(env)] if env else []
    candidates += [_CHECKOUT / name, Path(sys.prefix).parent / name]
    for venv in candidates:
        if (venv / "bin" / "python").is_file():
            return venv / "bin" / "python"
    return candidates[0] / "bin" / "python"
