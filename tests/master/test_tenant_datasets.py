"""Served datasets are per tenant under the dataset roots (issue 43, item 7).

Before: a symlinked file inside a dataset was followed, any tenant could train on
another's dataset under the same root, a missing path was recorded where the tenant
chose, relative paths resolved against the server's working directory, and the 422
showed server paths."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from joynexus.errors import DatasetError, JoyNexusError, NotFoundError, SpecError
from joynexus.master.limits import MasterLimits
from joynexus.master.tenant_datasets import place_tenant_dataset
from joynexus.spec.workload import WorkloadSpec, parse_spec
from tests.fakes.base import FAKE_BASE_ID
from tests.fakes.plane import FakeServer
from tests.workflows.helpers import record_reach2d_demos


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_reach2d_demos(
        tmp_path_factory.mktemp("demos") / "reach2d", episodes=3, image_size=8
    )


@pytest.fixture
def root(tmp_path: Path, demos: Path) -> Path:
    """A dataset root where alice has 'reach2d' and bob has nothing yet."""
    import shutil

    root = tmp_path / "root"
    shutil.copytree(demos, root / "alice" / "reach2d")
    (root / "bob").mkdir()
    return root


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _sft(tenant: str, path: str, **extra: Any) -> WorkloadSpec:
    return parse_spec(
        {
            "tenant": tenant,
            "task": "sft",
            "base_model": {"id": FAKE_BASE_ID},
            "dataset": {"path": path},
            "action_module": {"type": "oft", "hidden_dim": 8, "num_blocks": 1},
            "algorithm": {"name": "sft", "samples_per_job": 4, "microbatch_size": 4},
            "scheduling": {"completion_target": 1},
            **extra,
        }
    )


@pytest.fixture
def server(tmp_path: Path, root: Path) -> Iterator[FakeServer]:
    srv = FakeServer(tmp_path / "run", limits=MasterLimits(dataset_roots=[root]))
    yield srv
    srv.close()


def _no_server_path(exc: JoyNexusError, tmp_path: Path) -> None:
    text = f"{exc.message} {exc.details}"
    assert str(tmp_path) not in text, text


# ----------------------------------------------------------------- placement


def test_a_relative_path_is_the_tenants_own_not_the_working_directory(
    root: Path, demos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server's working directory holds a 'reach2d' too: it is never read.
    cwd = tmp_path / "cwd"
    (cwd / "reach2d").mkdir(parents=True)
    monkeypatch.chdir(cwd)
    placed = place_tenant_dataset("reach2d", "alice", [root])
    assert placed.exists and placed.path == (root / "alice" / "reach2d").resolve()
    placed = place_tenant_dataset("./reach2d", "alice", [tmp_path / "other", root])
    assert placed.exists and placed.path == (root / "alice" / "reach2d").resolve()


def test_a_tenant_never_reaches_another_tenants_dataset(root: Path, tmp_path: Path) -> None:
    alice = root / "alice" / "reach2d"
    # Through '..' or an absolute path: refused whether or not the target exists.
    answers = []
    for written in ("../alice/reach2d", "../alice/nothing", str(alice), str(root / "x/y")):
        with pytest.raises(SpecError) as info:
            place_tenant_dataset(written, "bob", [root])
        if not written.startswith("/"):  # an absolute one is quoted as the tenant wrote it
            _no_server_path(info.value, tmp_path)
        answers.append(info.value.message.replace(written, "<path>"))
    assert len(set(answers)) == 1  # the same answer: nothing tells what exists
    # By name, only bob's own folder is searched: alice's 'reach2d' is not found.
    placed = place_tenant_dataset("reach2d", "bob", [root])
    assert not placed.exists and placed.path == (root / "bob" / "reach2d").resolve()
    # A placed (stored) spec's absolute path inside the tenant's own folder is kept.
    assert place_tenant_dataset(str(alice.resolve()), "alice", [root]).exists


@pytest.mark.parametrize("where", ["file", "data folder", "dataset", "middle", "tenant folder"])
def test_symlinks_are_refused_at_every_level(root: Path, tmp_path: Path, where: str) -> None:
    secret = tmp_path / "server-secret"
    secret.mkdir()
    (secret / "x.parquet").write_bytes(b"not yours")
    alice = root / "alice"
    written = "reach2d"
    if where == "file":  # a file inside the dataset, pointing at a server file
        data = next((alice / "reach2d" / "data").rglob("*.parquet"))
        data.unlink()
        data.symlink_to(secret / "x.parquet")
    elif where == "data folder":
        (alice / "reach2d" / "extra").symlink_to(secret, target_is_directory=True)
    elif where == "dataset":
        (alice / "linked").symlink_to(alice / "reach2d", target_is_directory=True)
        written = "linked"
    elif where == "middle":
        (alice / "sets").symlink_to(alice, target_is_directory=True)
        written = "sets/reach2d"
    else:  # bob's folder links to alice's
        (root / "bob").rmdir()
        (root / "bob").symlink_to(alice, target_is_directory=True)
    tenant = "bob" if where == "tenant folder" else "alice"
    with pytest.raises(DatasetError, match="symbolic link") as info:
        place_tenant_dataset(written, tenant, [root])
    _no_server_path(info.value, tmp_path)
    assert written in info.value.message


def test_a_failed_or_missing_lookup_creates_nothing(root: Path, tmp_path: Path) -> None:
    other = tmp_path / "second-root"
    other.mkdir()
    before = (_tree(root), _tree(other))
    placed = place_tenant_dataset("new/demos", "carol", [root, other])
    # Missing: it would be recorded in carol's folder of the last root, but nothing is
    # made by looking.
    assert not placed.exists and placed.path == (other / "carol" / "new" / "demos").resolve()
    for bad in ("../bob", "/etc", ""):
        with pytest.raises(SpecError):
            place_tenant_dataset(bad, "carol", [root, other])
    assert (_tree(root), _tree(other)) == before


# -------------------------------------------------------- through the Master


def test_submit_resolves_in_the_tenants_folder_and_answers_in_its_terms(
    server: FakeServer, root: Path, tmp_path: Path
) -> None:
    compiled = server.master.compiler.compile(_sft("alice", "reach2d"), "alice")
    assert compiled.spec.dataset is not None
    assert compiled.spec.dataset.path == (root / "alice" / "reach2d").resolve()

    # bob names alice's dataset, and a name nobody has: the same 404 either way.
    answers = []
    for name in ("reach2d", "nobody-has-this"):
        with pytest.raises(NotFoundError) as info:
            server.master.compiler.compile(_sft("bob", name), "bob")
        _no_server_path(info.value, tmp_path)
        answers.append(info.value.message.replace(name, "<name>"))
    assert answers[0] == answers[1]

    # A malformed dataset of bob's own: the 422 names bob's path, not the server's.
    bad = root / "bob" / "broken"
    (bad / "meta").mkdir(parents=True)
    (bad / "meta" / "info.json").write_text("{not json")
    with pytest.raises(DatasetError) as bad_info:
        server.master.compiler.compile(_sft("bob", "broken"), "bob")
    _no_server_path(bad_info.value, tmp_path)
    assert "broken" in bad_info.value.message
    assert not list((tmp_path / "run").glob("outputs/bob/workloads/*"))  # nothing recorded


def test_a_missing_dataset_is_recorded_only_in_the_tenants_own_folder(
    server: FakeServer, root: Path
) -> None:
    env = {"kind": "reach2d", "image_size": 8, "max_episode_steps": 3}
    before = _tree(root)
    compiled = server.master.compiler.compile(_sft("bob", "fresh/demos", env=env), "bob")
    assert compiled.needs_recording
    assert compiled.spec.dataset is not None
    assert compiled.spec.dataset.path == (root / "bob" / "fresh" / "demos").resolve()
    assert _tree(root) == before  # compiling records nothing; the launch does


def test_run_reads_local_paths_as_written(tmp_path: Path, demos: Path) -> None:
    """``joynexus run``'s limits (tenant_datasets off): a local path, no tenant folder."""
    srv = FakeServer(
        tmp_path / "run",
        limits=MasterLimits(dataset_roots=[demos.parent], tenant_datasets=False),
    )
    try:
        compiled = srv.master.compiler.compile(_sft("alice", str(demos)), "alice")
        assert compiled.spec.dataset is not None and compiled.spec.dataset.path == demos
    finally:
        srv.close()


def test_metadata_cannot_name_files_outside_the_dataset(tmp_path: Path, demos: Path) -> None:
    import json
    import shutil

    from joynexus.data.reader import LeRobotDataset

    copy = tmp_path / "escape"
    shutil.copytree(demos, copy)
    info_path = copy / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["data_path"] = "../elsewhere/" + info["data_path"]
    info_path.write_text(json.dumps(info))
    os.makedirs(tmp_path / "elsewhere", exist_ok=True)
    with pytest.raises(DatasetError, match="outside its own folder"):
        LeRobotDataset(copy)
