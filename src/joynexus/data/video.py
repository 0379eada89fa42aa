"""MP4 video encode / decode with PyAV (no ffmpeg binary needed).

Frames are written with presentation timestamps ``pts = frame_number`` in a ``1/fps``
time base, so a frame's time in the file is ``frame_number / fps``. In the v3.0 layout
several episodes share one file; each episode remembers its ``from_timestamp`` offset.

Decoding is by timestamp: seek to the keyframe before the first requested time, decode
forward, and take for each request the frame whose time is nearest. A frame further
than ``tolerance_s`` from the request is an error (a damaged or mismatched video),
never a silent substitute.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from joynexus.errors import DatasetError

__all__ = [
    "VideoEncoder",
    "VideoProbe",
    "decode_frames",
    "decode_span",
    "pick_frames",
    "probe_video",
]

DEFAULT_CODEC = "libx264"
# Close keyframes make random access by timestamp cheap (few frames decoded per seek).
DEFAULT_GOP = 2
DEFAULT_CRF = 23


class VideoEncoder:
    """Streams uint8 ``[H, W, C]`` RGB frames into one mp4 file.

    Args:
        path: Output file (its directory is created).
        fps: Frame rate; frame ``n`` gets time ``n / fps``.
        width, height: Frame size. ``yuv420p`` needs both even.
        codec: A PyAV encoder name (``libx264`` → ``h264``, ``libsvtav1`` → ``av1``, ...).
        crf: Constant-rate-factor quality (lower is better, larger files).
        gop: Keyframe interval in frames.

    Raises:
        DatasetError: odd frame size, or a codec this PyAV build does not ship.
    """

    def __init__(
        self,
        path: Path,
        *,
        fps: float,
        width: int,
        height: int,
        codec: str = DEFAULT_CODEC,
        crf: int = DEFAULT_CRF,
        gop: int = DEFAULT_GOP,
    ) -> None:
        if width % 2 or height % 2:
            raise DatasetError(
                f"video frames must have even width and height for yuv420p, got "
                f"{width}x{height}; store this camera as an image feature instead "
                "(use_videos=False)",
                width=width,
                height=height,
            )
        if codec not in av.codecs_available:
            raise DatasetError(
                f"video codec {codec!r} is not available in this PyAV build",
                codec=codec,
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.width = width
        self.height = height
        self.frames_written = 0
        rate = Fraction(fps).limit_denominator(1001)
        options = {"g": str(gop)}
        if codec.startswith("libx26") or codec == "libsvtav1":
            options["crf"] = str(crf)
        if codec.startswith("libx26"):
            options["preset"] = "veryfast"
        self._container = av.open(str(path), mode="w")
        stream = self._container.add_stream(codec, rate=rate, options=options)
        if not isinstance(stream, av.VideoStream):  # pragma: no cover - codec is a video codec
            self._container.close()
            raise DatasetError(f"codec {codec!r} is not a video codec", codec=codec)
        stream.width = width
        stream.height = height
        stream.pix_fmt = "yuv420p"
        self._stream = stream
        self._closed = False

    def add_frame(self, image: np.ndarray) -> None:
        """Append one uint8 ``[H, W, 3]`` frame."""
        if image.shape != (self.height, self.width, 3) or image.dtype != np.uint8:
            raise DatasetError(
                f"{self.path}: video frame must be uint8 [{self.height}, {self.width}, 3], "
                f"got {image.dtype} {list(image.shape)}",
                file=str(self.path),
            )
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        frame.pts = self.frames_written
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        self.frames_written += 1

    def size_bytes(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def close(self) -> None:
        """Flush the encoder and finish the file (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            for packet in self._stream.encode():
                self._container.mux(packet)
        finally:
            self._container.close()


@dataclass(frozen=True)
class VideoProbe:
    """What a video file's first stream says about itself."""

    width: int
    height: int
    codec: str
    pix_fmt: str | None
    fps: float | None
    num_frames: int


def probe_video(path: Path) -> VideoProbe:
    """Read the first video stream's parameters.

    Raises:
        DatasetError: the file is missing, unreadable or has no video stream.
    """
    if not path.is_file():
        raise DatasetError(f"{path}: video file missing", file=str(path))
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise DatasetError(f"{path}: no video stream", file=str(path))
            stream = container.streams.video[0]
            rate = stream.average_rate
            return VideoProbe(
                width=int(stream.codec_context.width),
                height=int(stream.codec_context.height),
                codec=str(stream.codec_context.name),
                pix_fmt=stream.codec_context.pix_fmt,
                fps=float(rate) if rate else None,
                num_frames=int(stream.frames),
            )
    except av.FFmpegError as exc:
        raise DatasetError(f"{path}: cannot read video ({exc})", file=str(path)) from exc


def decode_frames(path: Path, timestamps: list[float], *, tolerance_s: float) -> np.ndarray:
    """Decode the frames nearest to ``timestamps`` (seconds in the file).

    Returns:
        uint8 ``[len(timestamps), H, W, 3]`` in the order asked.

    Raises:
        DatasetError: the file is missing or unreadable, or no decoded frame lies
            within ``tolerance_s`` of a requested timestamp.
    """
    if not timestamps:
        raise ValueError("decode_frames needs at least one timestamp")
    times, images = decode_span(path, min(timestamps), max(timestamps), tolerance_s=tolerance_s)
    return pick_frames(path, times, images, timestamps, tolerance_s=tolerance_s)


def decode_span(
    path: Path, first: float, last: float, *, tolerance_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Decode every frame from ``first - tolerance_s`` through ``last`` (seconds in the file).

    Returns:
        The frames' times ``float64 [N]`` and the frames, uint8 ``[N, H, W, 3]``.

    Raises:
        DatasetError: the file is missing or unreadable, or holds no frame there.
    """
    if not path.is_file():
        raise DatasetError(f"{path}: video file missing", file=str(path))
    times: list[float] = []
    images: list[np.ndarray] = []
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            if stream.time_base is not None and first > 0:
                container.seek(
                    int(first / stream.time_base), stream=stream, backward=True, any_frame=False
                )
            for frame in container.decode(stream):
                t = float(frame.time) if frame.time is not None else 0.0
                if t >= first - tolerance_s - 1e-9:
                    times.append(t)
                    images.append(frame.to_ndarray(format="rgb24"))
                if t >= last - 1e-9:
                    break
    except av.FFmpegError as exc:
        raise DatasetError(f"{path}: cannot decode video ({exc})", file=str(path)) from exc
    if not times:
        raise DatasetError(
            f"{path}: no frame decoded at or after {first:.4f}s (video too short?)",
            file=str(path),
            timestamp=first,
        )
    return np.asarray(times), np.stack(images)


def pick_frames(
    path: Path,
    times: np.ndarray,
    images: np.ndarray,
    timestamps: list[float],
    *,
    tolerance_s: float,
) -> np.ndarray:
    """The decoded frames (:func:`decode_span`) nearest to ``timestamps``, in order.

    Raises:
        DatasetError: no decoded frame lies within ``tolerance_s`` of a timestamp.
    """
    out = []
    for ts in timestamps:
        j = int(np.argmin(np.abs(times - ts)))
        if abs(times[j] - ts) > tolerance_s:
            raise DatasetError(
                f"{path}: no frame within tolerance_s={tolerance_s} of t={ts:.4f}s "
                f"(nearest decoded frame at {times[j]:.4f}s)",
                file=str(path),
                timestamp=ts,
                nearest=float(times[j]),
            )
        out.append(images[j])
    return np.stack(out)
