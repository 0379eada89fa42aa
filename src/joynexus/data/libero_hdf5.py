"""Import LIBERO's official demonstrations (robomimic-style hdf5) into LeRobot v3.0.

``joynexus data import --from libero-hdf5 PATH --out DIR`` runs
:func:`import_libero_hdf5`. ``PATH`` is one ``<task>_demo.hdf5`` file as LIBERO
publishes them, or a folder of them (one suite). The layout read, per file::

    data                      attrs: problem_info (JSON with "language_instruction"), ...
    data/demo_<k>/actions     float [T, 7]   OSC_POSE deltas (6) and gripper
    data/demo_<k>/obs/agentview_rgb     uint8 [T, H, W, 3]
    data/demo_<k>/obs/eye_in_hand_rgb   uint8 [T, H, W, 3]
    data/demo_<k>/obs/ee_pos  [T, 3], obs/ee_ori [T, 3] (axis-angle), obs/gripper_states [T, 2]
    data/demo_<k>/rewards, dones        [T] (optional)

Frames become what the LIBERO env adapter serves (:mod:`joynexus.envs.libero`), so a
tenant can train on them and be evaluated in the simulator with the same schema:
cameras ``image`` and ``wrist_image`` rotated by 180° (LIBERO's renders are upside down;
the LeRobot LIBERO datasets rotate them the same way), state 8 = ``ee_pos``, ``ee_ori``,
``gripper_states``; actions 7. Every demonstration in LIBERO's files succeeded: its last
frame is marked ``next.success`` (or the frames its ``dones`` marks).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from joynexus.data.record import dataset_features
from joynexus.data.writer import LeRobotDatasetWriter
from joynexus.envs.render import resize_image
from joynexus.errors import DatasetError
from joynexus.models.schema import LIBERO, CameraSpec

__all__ = ["LIBERO_HDF5_FPS", "ImportSummary", "hdf5_files", "import_libero_hdf5"]

#: LIBERO's demonstrations were recorded at the controller's rate.
LIBERO_HDF5_FPS = 20
_CAMERAS = {"image": "agentview_rgb", "wrist_image": "eye_in_hand_rgb"}
_STATE_KEYS = ("ee_pos", "ee_ori", "gripper_states")


@dataclass(frozen=True)
class ImportSummary:
    """What :func:`import_libero_hdf5` wrote."""

    root: Path
    files: int
    episodes: int
    frames: int
    tasks: tuple[str, ...]


def hdf5_files(path: Path) -> list[Path]:
    """The hdf5 files at ``path`` (a file, or a folder's ``*.hdf5`` in name order).

    Raises:
        DatasetError: nothing there, or a folder without hdf5 files.
    """
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".hdf5", ".h5"))
        if files:
            return files
        raise DatasetError(f"{path} holds no .hdf5 files; pass a LIBERO demo file or its folder")
    raise DatasetError(f"{path} does not exist; pass a LIBERO demo file or its folder")


def _demo_order(name: str) -> tuple[int, str]:
    match = re.fullmatch(r"demo_(\d+)", name)
    return (int(match.group(1)) if match else 1 << 30, name)


def _instruction(path: Path, data: Any) -> str:
    raw = data.attrs.get("problem_info")
    if raw is not None:
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        try:
            language = json.loads(text).get("language_instruction")
        except (json.JSONDecodeError, AttributeError):
            language = None
        if isinstance(language, str | list) and language:
            return " ".join(language) if isinstance(language, list) else language
    # The file name is the task: "<SCENE_>pick_up_the_black_bowl_..._demo.hdf5".
    stem = re.sub(r"_demo$", "", path.stem)
    stem = re.sub(r"^[A-Z0-9_]+?_SCENE\d+_", "", stem)
    return stem.replace("_", " ")


def _read(group: Any, key: str, where: str) -> np.ndarray:
    if key not in group:
        raise DatasetError(
            f"{where} has no '{key}': not a LIBERO demonstration (expected actions and "
            f"obs/{', obs/'.join([*_CAMERAS.values(), *_STATE_KEYS])})"
        )
    return np.asarray(group[key][()])


@dataclass(frozen=True)
class _Demo:
    actions: np.ndarray  # float32 [T, 7]
    state: np.ndarray  # float32 [T, 8]
    images: dict[str, np.ndarray]  # camera -> uint8 [T, H, W, 3]
    rewards: np.ndarray  # float32 [T]
    dones: np.ndarray  # bool [T], the last one set


def _read_demo(demo: Any, where: str) -> _Demo:
    if "obs" not in demo:
        raise DatasetError(f"{where} has no 'obs' group: not a LIBERO demo file")
    actions = _read(demo, "actions", where).astype(np.float32)
    obs = demo["obs"]
    images = {cam: _read(obs, key, f"{where}/obs") for cam, key in _CAMERAS.items()}
    parts = [_read(obs, key, f"{where}/obs").reshape(len(actions), -1) for key in _STATE_KEYS]
    state = np.concatenate(parts, axis=1).astype(np.float32)
    length = len(actions)
    if length == 0 or any(len(a) != length for a in (state, *images.values())):
        raise DatasetError(f"{where}: actions, images and states differ in length or are empty")
    if actions.shape[1:] != (LIBERO.action_dim,) or state.shape[1] != LIBERO.state_dim:
        raise DatasetError(
            f"{where}: actions {actions.shape[1:]} and state {state.shape[1]}-d; LIBERO's "
            f"are {LIBERO.action_dim}-d and {LIBERO.state_dim}-d"
        )
    for cam, stack in images.items():
        if stack.ndim != 4 or stack.shape[3] != 3 or stack.dtype != np.uint8:
            raise DatasetError(f"{where}: {_CAMERAS[cam]} is not uint8 [T, H, W, 3] images")
    rewards = (
        np.asarray(demo["rewards"][()], np.float32).reshape(-1)
        if "rewards" in demo
        else np.zeros(length, np.float32)
    )
    dones = (
        np.asarray(demo["dones"][()], bool).reshape(-1)
        if "dones" in demo
        else np.zeros(length, bool)
    )
    if len(rewards) != length or len(dones) != length:
        raise DatasetError(f"{where}: rewards or dones differ in length from actions")
    dones[-1] = True  # the demonstration ends here, and LIBERO kept only successes
    return _Demo(actions, state, images, rewards, dones)


def _create_writer(
    out: str | Path, demo: _Demo, image_size: int | None, use_videos: bool, repo_id: str | None
) -> LeRobotDatasetWriter:
    height, width = demo.images["image"].shape[1:3]
    if image_size:
        height = width = image_size
    schema = LIBERO.model_copy(
        update={"cameras": {cam: CameraSpec(height=height, width=width) for cam in _CAMERAS}}
    )
    return LeRobotDatasetWriter.create(
        out,
        repo_id=repo_id or "local/libero_hdf5",
        fps=LIBERO_HDF5_FPS,
        features=dataset_features(schema, use_videos=use_videos),
        robot_type="libero",
        use_videos=use_videos,
    )


def _write_demo(writer: LeRobotDatasetWriter, demo: _Demo, task: str, flip: bool) -> None:
    for t in range(len(demo.actions)):
        frame: dict[str, Any] = {}
        for cam, stack in demo.images.items():
            shape = writer.features[f"observation.images.{cam}"].shape
            image = stack[t][::-1, ::-1] if flip else stack[t]
            frame[f"observation.images.{cam}"] = resize_image(image, shape[0], shape[1])
        frame["observation.state"] = demo.state[t]
        frame["action"] = demo.actions[t]
        frame["next.reward"] = np.float32(demo.rewards[t])
        frame["next.done"] = bool(demo.dones[t])
        frame["next.success"] = bool(demo.dones[t])
        writer.add_frame(frame, task=task)
    writer.save_episode()


def import_libero_hdf5(
    path: str | Path,
    out: str | Path,
    *,
    image_size: int | None = None,
    use_videos: bool = True,
    repo_id: str | None = None,
    flip_images: bool = True,
    on_episode: Callable[[str, int, int], None] | None = None,
) -> ImportSummary:
    """Convert LIBERO hdf5 demonstrations at ``path`` into a LeRobot dataset at ``out``.

    Args:
        path: A LIBERO ``*_demo.hdf5`` file or a folder of them.
        out: Dataset directory to create (must not exist).
        image_size: Resize both cameras to this square size (default: as stored).
        use_videos: Cameras as mp4 videos (else PNG images in parquet).
        repo_id: Dataset id for ``info.json`` (default ``local/libero_hdf5``).
        flip_images: Rotate images by 180° as the env adapter and LeRobot's LIBERO do.
        on_episode: Called as ``(task, demo_index, length)`` after each demonstration.

    Raises:
        DatasetError: a file is missing, unreadable, or not in LIBERO's layout.
    """
    import h5py

    files = hdf5_files(Path(path))
    frames = episodes = 0
    tasks: list[str] = []
    writer: LeRobotDatasetWriter | None = None
    try:
        for file in files:
            try:
                handle = h5py.File(file, "r")
            except OSError as exc:
                raise DatasetError(f"{file} is not a readable hdf5 file: {exc}") from exc
            with handle:
                if "data" not in handle:
                    raise DatasetError(f"{file} has no 'data' group: not a LIBERO demo file")
                data = handle["data"]
                task = _instruction(file, data)
                tasks.append(task)
                for name in sorted(data.keys(), key=_demo_order):
                    demo = _read_demo(data[name], f"{file.name}:data/{name}")
                    if writer is None:
                        writer = _create_writer(out, demo, image_size, use_videos, repo_id)
                    _write_demo(writer, demo, task, flip_images)
                    frames += len(demo.actions)
                    episodes += 1
                    if on_episode is not None:
                        on_episode(task, _demo_order(name)[0], len(demo.actions))
        if writer is None:
            raise DatasetError(f"{path} holds no demonstrations (no data/demo_<k> groups)")
        writer.finalize()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return ImportSummary(
        root=Path(out), files=len(files), episodes=episodes, frames=frames, tasks=tuple(tasks)
    )
