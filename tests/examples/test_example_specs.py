"""Every shipped workload spec validates and none sets the deprecated ``output_dir``.

Regression: the examples still wrote ``output_dir: ../../runs/examples``, a field that
``joynexus run`` and ``serve`` ignore (a tenant's files live in the run directory), so
a user reading them looked for checkpoints in the wrong place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from joynexus.spec.workload import load_specs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPEC_FILES = sorted(EXAMPLES.rglob("*.yaml"))


def _workloads(raw: Any) -> list[dict[str, Any]]:
    items = raw.get("workloads", raw) if isinstance(raw, dict) else raw
    return [w for w in (items if isinstance(items, list) else [items]) if isinstance(w, dict)]


def test_the_examples_are_found() -> None:
    assert len(SPEC_FILES) >= 10


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_spec_has_no_output_dir(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    if not (isinstance(raw, dict | list) and _workloads(raw) and "tenant" in _workloads(raw)[0]):
        pytest.skip("not a workload spec file")
    assert all("output_dir" not in w for w in _workloads(raw)), path
    assert load_specs(path)  # and it still validates
