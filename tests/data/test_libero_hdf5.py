"""``joynexus data import --from libero-hdf5``: LIBERO's demo files into LeRobot v3.0.

The test writes a small file in LIBERO's layout (two demonstrations of one task; a second
file with one demonstration of another), imports the folder, and reads it back.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.data import LeRobotDataset
from joynexus.data.libero_hdf5 import import_libero_hdf5
from joynexus.errors import DatasetError

h5py = pytest.importorskip("h5py")

SIZE = 16
SPATIAL = "pick up the black bowl between the plate and the ramekin and place it on the plate"


def _camera(length: int, offset: int) -> np.ndarray:
    # A gradient that tells up from down and left from right (the import rotates by 180°).
    rows = np.arange(SIZE, dtype=np.uint8)[:, None] * 8
    cols = np.arange(SIZE, dtype=np.uint8)[None, :] * 4
    rows, cols = np.broadcast_arrays(rows, cols)
    frame = np.stack([rows + cols, rows, cols], axis=-1).astype(np.uint8)
    return np.stack([frame + np.uint8(offset + t) for t in range(length)])


def _write_demo_file(path: Path, lengths: list[int], language: str | None) -> None:
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        if language is not None:
            data.attrs["problem_info"] = json.dumps(
                {"problem_name": "libero_tabletop_manipulation", "language_instruction": language}
            )
        data.attrs["env_args"] = json.dumps({"env_name": "Libero_Tabletop_Manipulation"})
        for k, length in enumerate(lengths):
            demo = data.create_group(f"demo_{k}")
            t = np.arange(length, dtype=np.float64)[:, None]
            demo["actions"] = np.tile(np.linspace(-1, 1, 7), (length, 1)) * (k + 1) + t * 0.01
            demo["rewards"] = np.zeros(length)
            demo["dones"] = np.zeros(length, dtype=np.uint8)
            obs = demo.create_group("obs")
            obs["agentview_rgb"] = _camera(length, 0)
            obs["eye_in_hand_rgb"] = _camera(length, 100)
            obs["ee_pos"] = np.hstack([t, t + k, t * 2])
            obs["ee_ori"] = np.full((length, 3), 0.5 + k)
            obs["gripper_states"] = np.hstack([t * 0 + 0.04, t * 0 - 0.04])
            obs["joint_states"] = np.zeros((length, 7))


def test_a_folder_of_demo_files_round_trips(tmp_path: Path) -> None:
    src = tmp_path / "libero_spatial"
    src.mkdir()
    _write_demo_file(src / "A_demo.hdf5", [5, 3], SPATIAL)
    # No problem_info: the task comes from the file name, as LIBERO names its files.
    _write_demo_file(src / "KITCHEN_SCENE3_turn_on_the_stove_demo.hdf5", [4], None)
    out = tmp_path / "ds"
    summary = import_libero_hdf5(src, out, use_videos=False)
    assert (summary.files, summary.episodes, summary.frames) == (2, 3, 12)
    assert summary.tasks == (SPATIAL, "turn on the stove")

    ds = LeRobotDataset(out)
    assert ds.num_episodes == 3 and len(ds) == 12
    assert ds.meta.fps == 20
    assert ds.features["observation.state"].shape == (8,)
    assert ds.features["observation.images.wrist_image"].shape == (SIZE, SIZE, 3)
    first = ds[0]
    assert first["task"] == SPATIAL  # "A_demo.hdf5" sorts first
    np.testing.assert_allclose(first["observation.state"], [0, 0, 0, 0.5, 0.5, 0.5, 0.04, -0.04])
    np.testing.assert_allclose(first["action"], np.linspace(-1, 1, 7), atol=1e-6)
    image = np.asarray(first["observation.images.image"])
    if image.shape[0] == 3:  # channels first, as torch-style readers return it
        image = np.moveaxis(image, 0, -1)
    if image.dtype != np.uint8:
        image = np.round(image * 255).astype(np.uint8)
    np.testing.assert_array_equal(image, _camera(1, 0)[0][::-1, ::-1])
    # demo_1 of the first file: second episode, its own actions and state.
    start, end = ds.episode_bounds(5)  # the bounds of the episode frame 5 is in
    assert (start, end) == (5, 8)
    np.testing.assert_allclose(ds[start]["observation.state"][3:6], 1.5)
    success = ds.column("next.success").reshape(-1)
    assert success.tolist() == [False] * 4 + [True] + [False] * 2 + [True] + [False] * 3 + [True]


def test_the_cli_imports_and_resizes(tmp_path: Path) -> None:
    src = tmp_path / "one_demo.hdf5"
    _write_demo_file(src, [3], SPATIAL)
    out = tmp_path / "ds"
    result = CliRunner().invoke(
        app,
        [
            "data",
            "import",
            str(src),
            "--from",
            "libero-hdf5",
            "--out",
            str(out),
            "--images",
            "--image-size",
            "8",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "1 episodes, 3 frames, 1 tasks from 1 files" in " ".join(result.output.split())
    ds = LeRobotDataset(out)
    assert ds.features["observation.images.image"].shape == (8, 8, 3)


def test_unknown_format_and_wrong_layout_say_what_to_fix(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app, ["data", "import", str(tmp_path), "--from", "robomimic", "--out", str(tmp_path / "x")]
    )
    assert result.exit_code == 2 and "known: libero-hdf5" in result.output
    bad = tmp_path / "bad.hdf5"
    with h5py.File(bad, "w") as f:
        f.create_group("data/demo_0/obs")
        f["data/demo_0/actions"] = np.zeros((2, 7))
    with pytest.raises(DatasetError, match="has no 'agentview_rgb'"):
        import_libero_hdf5(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(DatasetError, match="does not exist"):
        import_libero_hdf5(tmp_path / "missing", tmp_path / "out")
