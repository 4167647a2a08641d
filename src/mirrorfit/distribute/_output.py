"""Copy a child process's output pipe line by line, each line with a prefix (``[worker 1] ...``).

``\\n`` and ``\\r\\n`` end a line. A lone ``\\r`` ends one too, because progress bars redraw
with it: such redraws are shown at most every :data:`REDRAW_INTERVAL_S` per pipe, each on its
own line, so that several tasks' bars never merge into one garbled line.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from typing import IO, BinaryIO, Callable

REDRAW_INTERVAL_S = 2.0  # seconds; a "\r" progress redraw is printed at most this often per pipe
MAX_LINE = 1 << 16  # bytes; a longer run without a line end is printed in pieces
_READ_BYTES = 1 << 16  # bytes asked of one os.read
_LINE_END = re.compile(rb"[\r\n]")


def stream_lines(
    pipe: BinaryIO,
    prefix: str,
    write: Callable[[str], None],
    redraw_interval_s: float = REDRAW_INTERVAL_S,
) -> None:
    """Read ``pipe`` (unbuffered bytes) to its end, calling ``write(prefix + line + "\\n")`` once
    per line (UTF-8, bad bytes replaced), from this thread only (share a stream: lock in ``write``);
    close ``pipe`` at the end. ``redraw_interval_s``: seconds between two ``\\r`` redraws shown;
    blank redraws are never shown.
    """
    fd, buf, last_redraw = pipe.fileno(), b"", -math.inf

    def emit(data: bytes) -> None:
        write(prefix + data.decode("utf-8", "replace") + "\n")

    while True:
        try:
            chunk = os.read(fd, _READ_BYTES)
        except OSError:
            break  # the pipe was closed under us: the task is gone
        if not chunk:
            break
        buf += chunk
        while (m := _LINE_END.search(buf)) is not None:
            i = m.start()
            if buf[i : i + 1] == b"\n" or buf[i + 1 : i + 2] == b"\n":  # "\n" or "\r\n"
                emit(buf[:i])
                buf = buf[i + (1 if buf[i : i + 1] == b"\n" else 2) :]
                continue
            if i + 1 == len(buf):
                break  # a "\r" that may be the first half of "\r\n": wait for more
            segment, buf = buf[:i], buf[i + 1 :]
            now = time.monotonic()
            if segment.strip() and now - last_redraw >= redraw_interval_s:
                last_redraw = now
                emit(segment)
        if len(buf) > MAX_LINE:
            emit(buf)
            buf = b""
    pipe.close()
    if buf.strip(b"\r"):
        emit(buf.strip(b"\r"))


def line_writer(stream: IO[str], lock: threading.Lock) -> Callable[[str], None]:
    """A ``write`` for :func:`stream_lines` that puts each line on ``stream`` whole and flushed,
    holding ``lock``; share one lock among every pipe (and other writers) of a stream."""

    def write(line: str) -> None:
        with lock:
            stream.write(line)
            stream.flush()

    return write


def start_streaming(
    pipe: BinaryIO, prefix: str, write: Callable[[str], None], name: str
) -> threading.Thread:
    """Run :func:`stream_lines` on a started daemon thread called ``name``; join it to wait
    for the pipe's last line (daemon: a pipe held open by a grandchild never blocks exit)."""
    thread = threading.Thread(
        target=stream_lines, args=(pipe, prefix, write), daemon=True, name=name
    )
    thread.start()
    return thread
