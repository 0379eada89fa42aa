"""``joynexus bench front-channel``: how a front process hands a decoded observation over.

Two processes on this machine, one Unix stream socket between them, the way a front
process and the model process of ``joynexus serve --front-procs N`` talk. The sender
hands over one decoded predict observation (one ``uint8 [1, H, W, 3]`` camera, a
``float32 [1, 4]`` state, an instruction) and waits for a small answer; the receiver
must end up owning numpy arrays it may keep. Two channels:

* ``pickle``: the arrays pickled (protocol 5) into one length-prefixed frame on the
  socket (:mod:`joynexus.server.front.channel`, what the server uses);
* ``shm``: the arrays copied into a slot of a ``multiprocessing.shared_memory`` ring
  and only a descriptor (slot, dtype, shape, offset) framed on the socket; the receiver
  copies them out of the slot (the slot is reused by a later request).

Reported: median and p99 microseconds of one round trip per image size.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from joynexus.server.front.channel import decode_frame_body, encode_frame

__all__ = ["CHANNELS", "print_report", "run_front_channel_bench"]

CHANNELS = ("pickle", "shm")
_SLOTS = 8


def _recv_frame(sock: socket.socket) -> tuple[Any, ...] | None:
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    body = _recv_exact(sock, int.from_bytes(head, "big"))
    return None if body is None else decode_frame_body(body)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return bytes(buf)


def _receiver(sock: socket.socket, shm_name: str | None) -> None:  # pragma: no cover - child
    shm = None if shm_name is None else shared_memory.SharedMemory(shm_name)
    kept: Any = None
    while True:
        msg = _recv_frame(sock)
        if msg is None:
            break
        if shm is None:
            kept = msg[1]  # the arrays, already owned by this process
        else:
            kept = {
                name: np.array(np.ndarray(shape, np.dtype(dt), buffer=shm.buf, offset=off))
                for name, dt, shape, off in msg[1]
            }
        sock.sendall(encode_frame((msg[0], len(kept))))
    del kept
    if shm is not None:
        shm.close()


def _observation(h: int, w: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "top": rng.integers(0, 255, (1, h, w, 3), dtype=np.uint8),
        "state": rng.normal(size=(1, 4)).astype(np.float32),
        "instructions": ["reach the target"],
    }


def _round_trips(channel: str, h: int, w: int, n: int) -> list[float]:
    obs = _observation(h, w)
    arrays = {k: v for k, v in obs.items() if isinstance(v, np.ndarray)}
    slot_bytes = sum(a.nbytes for a in arrays.values()) + 64 * len(arrays)
    shm = shared_memory.SharedMemory(create=True, size=slot_bytes * _SLOTS)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ctx = mp.get_context("spawn")
    child = ctx.Process(
        target=_receiver,
        args=(theirs, shm.name if channel == "shm" else None),
        daemon=True,
    )
    child.start()
    theirs.close()
    out: list[float] = []
    try:
        for i in range(n):
            start = time.perf_counter()
            if channel == "pickle":
                ours.sendall(encode_frame((i, obs)))
            else:
                base = (i % _SLOTS) * slot_bytes
                desc = []
                off = base
                for name, a in arrays.items():
                    np.ndarray(a.shape, a.dtype, buffer=shm.buf, offset=off)[...] = a
                    desc.append((name, a.dtype.str, a.shape, off))
                    off += a.nbytes + (-a.nbytes % 64)
                ours.sendall(encode_frame((i, desc, obs["instructions"])))
            reply = _recv_frame(ours)
            assert reply is not None and reply[0] == i
            out.append(time.perf_counter() - start)
    finally:
        ours.close()
        child.join(timeout=10)
        shm.close()
        shm.unlink()
    return out[n // 10 :]  # the first tenth warms both processes up


def run_front_channel_bench(
    *,
    sizes: Sequence[tuple[int, int]] = ((32, 32), (224, 224), (480, 640)),
    messages: int = 2000,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Round-trip times of every channel at every image size (JSON-ready)."""
    say = progress or (lambda _line: None)
    rows = []
    for h, w in sizes:
        for channel in CHANNELS:
            say(f"{channel}: {messages} observations of {h}x{w}")
            times = sorted(_round_trips(channel, h, w, messages))
            rows.append(
                {
                    "channel": channel,
                    "image": f"{h}x{w}",
                    "median_us": statistics.median(times) * 1e6,
                    "p99_us": times[int(0.99 * (len(times) - 1))] * 1e6,
                }
            )
    return {"messages": messages, "rows": rows}


def print_report(result: dict[str, Any], console: Console) -> None:
    table = Table(
        "image",
        "channel",
        "median us",
        "p99 us",
        title=f"front -> model process round trip ({result['messages']} observations each)",
    )
    for row in result["rows"]:
        table.add_row(
            row["image"], row["channel"], f"{row['median_us']:.0f}", f"{row['p99_us']:.0f}"
        )
    console.print(table)
