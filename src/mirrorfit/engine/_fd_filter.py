"""Lines a native library writes straight to a file descriptor (TensorFlow's start-up log on
stderr, gloo's "connected" line on stdout), held back while a block runs and written back
without the ones a predicate drops: no Python logging setting reaches them."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Callable, Iterator


@contextlib.contextmanager
def filtered(fd: int, dropped: Callable[[str], bool]) -> Iterator[None]:
    """Run the block with ``fd`` (1 or 2) in a temporary file, then write back each line for
    which ``dropped(line)`` is false, in order, to the same stream."""
    stream = sys.stdout if fd == 1 else sys.stderr
    stream.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), fd)
        try:
            yield
        finally:
            stream.flush()
            os.dup2(saved, fd)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", errors="replace")
            kept = [line for line in text.splitlines(keepends=True) if not dropped(line)]
            if kept:
                stream.write("".join(kept))
                stream.flush()
