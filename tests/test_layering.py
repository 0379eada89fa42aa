"""Dependencies point one way (docs/ARCHITECTURE.md, "Dependencies point one way").

Two kinds of check:

* **Static, over the source.** Every ``import`` / ``from ... import`` in
  ``src/joynexus`` — module level, function-local and under ``TYPE_CHECKING`` alike —
  and every ``importlib.import_module("joynexus...")`` with a literal name is an edge
  between two modules. Each package belongs to a tier of :data:`TIERS`; an edge from
  one package to another must point to a lower tier (packages of one tier are
  independent of each other). Modules of one package may import each other, but no
  import cycle is allowed anywhere.
* **Dynamic, for the modules that must stay light.** Imported in a fresh interpreter
  (this process has torch loaded already), each loads neither torch nor a joynexus
  package outside what it may depend on (:data:`LIGHT`).

The first tests check the checks: the tier map rejects a known-bad edge, the collector
sees function-local, ``TYPE_CHECKING`` and relative imports, the cycle finder finds a
cycle and the import probe sees what a module drags in.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

#: Tiers, top first. A module may import from packages of lower tiers only.
TIERS: tuple[tuple[str, ...], ...] = (
    ("joynexus.cli",),
    # Tools behind the CLI, and the root package (its lazy ``joynexus.Client`` imports
    # the client).
    ("joynexus", "joynexus.demo", "joynexus.bench", "joynexus.sim"),
    ("joynexus.server", "joynexus.client"),
    # The Master starts and stops the workflow loops on a plane the runtime builds.
    ("joynexus.master",),
    ("joynexus.runtime",),
    ("joynexus.workflows",),
    ("joynexus.services",),
    # The metrics control sampler reads the scheduler and the queues; dataset
    # recording reads workload specs.
    ("joynexus.metrics", "joynexus.data"),
    ("joynexus.spec",),
    ("joynexus.control", "joynexus.queues", "joynexus.envs", "joynexus.algorithms"),
    ("joynexus.models",),
    # Other projects' formats and side venvs (LeRobot checkpoints, openpi).
    ("joynexus.api", "joynexus.wire", "joynexus.utils", "joynexus.interop"),
    ("joynexus.errors",),
)

#: Edges that break the direction today, each with why and what removes it. An entry
#: that no longer occurs fails the test, so the list only shrinks.
ALLOWED: dict[tuple[str, str], str] = {}


# --- the static check ---------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules(src: Path = SRC) -> dict[str, Path]:
    """Every module under ``src/joynexus`` by dotted name."""
    return {module_name(p, src): p for p in sorted((src / "joynexus").rglob("*.py"))}


def _resolve(target: str, known: Iterable[str]) -> str:
    """The longest known module that ``target`` names (a name inside it otherwise)."""
    names = set(known)
    t = target
    while t and t not in names:
        t = t.rpartition(".")[0]
    return t or target


def imports_of(module: str, source: str, *, is_package: bool, known: Iterable[str]) -> list[Edge]:
    """The joynexus modules ``module`` imports anywhere in ``source``."""
    known = set(known)
    out: list[Edge] = []

    def add(target: str, line: int) -> None:
        if target == "joynexus" or target.startswith("joynexus."):
            out.append(Edge(module, _resolve(target, known), line))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                parent = ".".join([*base, *([node.module] if node.module else [])])
            else:
                parent = node.module or ""
            for alias in node.names:
                sub = f"{parent}.{alias.name}"
                add(sub if sub in known else parent, node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            add(node.args[0].value, node.lineno)
    return out


def all_edges(src: Path = SRC) -> list[Edge]:
    mods = source_modules(src)
    edges: list[Edge] = []
    for name, path in mods.items():
        found = imports_of(
            name, path.read_text(), is_package=path.name == "__init__.py", known=mods
        )
        edges.extend(e for e in found if e.target != name)
    return edges


def package_of(module: str, tiers: tuple[tuple[str, ...], ...] = TIERS) -> str | None:
    """The tiered package a module belongs to (the longest matching prefix)."""
    packages = sorted((p for tier in tiers for p in tier), key=len, reverse=True)
    for p in packages:
        if module == p or (p != "joynexus" and module.startswith(p + ".")):
            return p
    return None


def tier_of(package: str, tiers: tuple[tuple[str, ...], ...] = TIERS) -> int:
    """0 for the top tier; larger is lower."""
    return next(i for i, tier in enumerate(tiers) if package in tier)


def upward_edges(
    edges: Iterable[Edge],
    tiers: tuple[tuple[str, ...], ...] = TIERS,
    allowed: Mapping[tuple[str, str], str] | None = None,
) -> list[str]:
    """Edges between packages that do not point to a lower tier (and are not allowed)."""
    allowed = ALLOWED if allowed is None else allowed
    bad: list[str] = []
    for e in edges:
        a, b = package_of(e.source, tiers), package_of(e.target, tiers)
        if a is None or b is None:
            bad.append(f"{e.source} -> {e.target} (line {e.line}): a package without a tier")
        elif (
            a != b
            and tier_of(a, tiers) >= tier_of(b, tiers)
            and (e.source, e.target) not in allowed
        ):
            bad.append(f"{e.source} -> {e.target} (line {e.line}): {a} may not import {b}")
    return sorted(set(bad))


def cycles(edges: Iterable[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# --- the import probe -----------------------------------------------------------------------


def loaded_after_import(module: str) -> set[str]:
    """``sys.modules`` of a fresh interpreter after ``import module``."""
    code = (
        "import importlib, json, sys; "
        f"importlib.import_module({module!r}); print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def offending(loaded: Iterable[str], forbidden: Iterable[str]) -> list[str]:
    """The forbidden packages (or their submodules) among ``loaded``."""
    prefixes = tuple(forbidden)
    return sorted({p for name in loaded for p in prefixes if name == p or name.startswith(p + ".")})


def _except(*may_load: str) -> tuple[str, ...]:
    """torch and every tiered package but ``may_load`` (and the root package)."""
    keep = {"joynexus", *may_load}
    return ("torch", *(p for tier in TIERS for p in tier if p not in keep))


#: Module → what importing it must not load.
LIGHT: dict[str, tuple[str, ...]] = {
    "joynexus.api": _except("joynexus.api"),
    "joynexus.wire": _except("joynexus.wire", "joynexus.errors"),
    "joynexus.client": _except(
        "joynexus.client", "joynexus.api", "joynexus.wire", "joynexus.errors"
    ),
    # The HTTP app: torch-free, and the Master / runtime / workflows are imported only
    # by what hosts it (server.serve).
    "joynexus.server.app": (
        "torch",
        "joynexus.master",
        "joynexus.runtime",
        "joynexus.workflows",
        "joynexus.client",
        "joynexus.cli",
    ),
    # A front process: HTTP decoding without torch or anything that hosts the model.
    "joynexus.server.front.worker": (
        "torch",
        "joynexus.master",
        "joynexus.runtime",
        "joynexus.workflows",
        "joynexus.client",
        "joynexus.cli",
    ),
    "joynexus.control.scheduler": _except("joynexus.control", "joynexus.errors", "joynexus.utils"),
    # The Inference Queue; the Training Queue stores torch tensors and imports torch.
    "joynexus.queues.inference": _except("joynexus.queues", "joynexus.errors", "joynexus.utils"),
    "joynexus.metrics": _except(
        "joynexus.metrics", "joynexus.api", "joynexus.errors", "joynexus.utils"
    ),
    "joynexus.metrics.prometheus": _except(
        "joynexus.metrics", "joynexus.api", "joynexus.errors", "joynexus.utils"
    ),
    "joynexus.metrics.control": _except(
        "joynexus.metrics", "joynexus.control", "joynexus.api", "joynexus.errors", "joynexus.utils"
    ),
    "joynexus.sim": _except(
        "joynexus.sim", "joynexus.control", "joynexus.errors", "joynexus.utils"
    ),
}


# --- the checks check ---------------------------------------------------------------------


def test_the_tier_map_rejects_known_bad_edges() -> None:
    bad = [
        Edge("joynexus.models.slots", "joynexus.data.sft", 1),
        Edge("joynexus.services.training", "joynexus.master.service", 2),
        Edge("joynexus.workflows.rl", "joynexus.runtime.plane", 3),
        Edge("joynexus.runtime.plane", "joynexus.master.service", 8),
        Edge("joynexus.client.sync", "joynexus.server.app", 4),
        Edge("joynexus.server.app", "joynexus.cli.main", 5),
        Edge("joynexus.control.scheduler", "joynexus.queues.training", 6),  # same tier
        Edge("joynexus.newpackage.x", "joynexus.errors", 7),  # no tier
    ]
    assert len(upward_edges(bad, allowed={})) == len(bad)
    good = [
        Edge("joynexus.master.service", "joynexus.workflows.launch", 1),
        Edge("joynexus.master.run", "joynexus.runtime.plane", 6),
        Edge("joynexus.data.sft", "joynexus.models.normalization", 2),
        Edge("joynexus.client.sync", "joynexus.api", 3),
        Edge("joynexus.cli.control", "joynexus", 4),
        Edge("joynexus.models.slots", "joynexus.models.policies", 5),  # within a package
    ]
    assert upward_edges(good, allowed={}) == []
    allowed = {("joynexus.models.slots", "joynexus.data.sft"): "test"}
    assert len(upward_edges(bad, allowed=allowed)) == len(bad) - 1


def test_the_collector_sees_every_kind_of_import() -> None:
    source = """
from __future__ import annotations
import os
from typing import TYPE_CHECKING
import joynexus.models.schema as schema
from joynexus import errors
from . import sibling
from .sibling import thing
if TYPE_CHECKING:
    from joynexus.master.service import MasterService

def f():
    from joynexus.data.record import record_missing_dataset
    importlib.import_module("joynexus.envs.pusht")
"""
    known = {
        "joynexus",
        "joynexus.errors",
        "joynexus.models.schema",
        "joynexus.models.payload",
        "joynexus.models.sibling",
        "joynexus.master.service",
        "joynexus.data.record",
        "joynexus.envs.pusht",
    }
    found = {
        e.target
        for e in imports_of("joynexus.models.payload", source, is_package=False, known=known)
    }
    assert found == {
        "joynexus.models.schema",
        "joynexus.errors",
        "joynexus.models.sibling",
        "joynexus.master.service",
        "joynexus.data.record",
        "joynexus.envs.pusht",
    }


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = [Edge("a", "b", 1), Edge("b", "c", 1), Edge("c", "a", 1), Edge("c", "d", 1)]
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles(edges[1:]) == []


def test_the_probe_sees_what_an_import_loads() -> None:
    assert offending({"torch._C", "joynexus.control.job"}, ("torch", "joynexus.control")) == [
        "joynexus.control",
        "torch",
    ]
    assert offending({"torchvision", "joynexus.controller"}, ("torch", "joynexus.control")) == []
    loaded = loaded_after_import("joynexus.metrics.control")
    assert offending(loaded, ("joynexus.control",)) == ["joynexus.control"]


# --- the checks -----------------------------------------------------------------------------


def test_every_package_has_a_tier() -> None:
    untiered = sorted({m for m in source_modules() if package_of(m) is None})
    assert untiered == [], f"add these packages to TIERS: {untiered}"


def test_every_import_points_down() -> None:
    bad = upward_edges(all_edges())
    assert bad == [], "imports against the direction of docs/ARCHITECTURE.md:\n" + "\n".join(bad)


def test_every_allowed_exception_still_exists() -> None:
    present = {(e.source, e.target) for e in all_edges()}
    stale = sorted(set(ALLOWED) - present)
    assert stale == [], f"these edges are gone: remove them from ALLOWED: {stale}"


def test_no_import_cycle() -> None:
    assert cycles(all_edges()) == []


@pytest.mark.parametrize("module", sorted(LIGHT))
def test_light_modules_stay_light(module: str) -> None:
    loaded = offending(loaded_after_import(module), LIGHT[module])
    assert loaded == [], f"importing {module} loads {loaded}"
