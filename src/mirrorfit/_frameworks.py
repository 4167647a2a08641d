"""What every layer may ask about the frameworks before one starts: whether a package is
installed (:func:`installed`, without importing it), the command that adds it
(:func:`install_hint`), and a block in which TensorFlow may start with its C++ start-up lines
filtered (:func:`tensorflow_start_filtered`): those are written to file descriptor 2 before
TensorFlow's logging is set up, so only holding the descriptor (:func:`filtered`) reaches them.
Plain Python; the data, models and artifacts use it without reaching up into the engines.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Callable, Iterator

# TensorFlow's own start-up lines, written to stderr before its logging is set up: an absl
# line (severity I/W/E/F, date, time, thread, file:line]), absl's preamble, and the CPU-feature
# notice's second line.
_STARTUP_LINE = re.compile(
    r"(?:([IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\]"
    r"|WARNING: All log messages before absl::InitializeLog\(\)"
    r"|To enable the following instructions:)"
)


def installed(framework: str) -> bool:
    """Whether ``framework`` (a top-level package) is installed, without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec(framework) is not None
    except (ImportError, ValueError, AttributeError):  # a broken or blocked package
        return False


def install_hint(extra: str) -> str:
    """The command that adds ``extra``, one of pyproject.toml's optional dependencies
    (tensorflow, jax, serve, bench), to an install of mirrorfit."""
    return f"pip install 'mirrorfit[{extra}]'"


def tensorflow_start_filtered():
    """A block in which TensorFlow may load (imported by something else: a data module,
    TensorBoard's writer), its start-up lines filtered by ``TF_CPP_MIN_LOG_LEVEL``."""
    if "tensorflow" in sys.modules:
        return contextlib.nullcontext()
    return startup_lines_filtered(_log_level())


def _log_level() -> int:
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


@contextlib.contextmanager
def startup_lines_filtered(level: int):
    """Run the block with file descriptor 2 in a temporary file, then write back what the
    log level ``level`` shows: TensorFlow writes its first lines before its logging is set up,
    where TF_CPP_MIN_LOG_LEVEL does not reach them (absl's preamble and oneDNN's notice are
    INFO and WARNING lines, twice: a profiler library carries a second copy of TensorFlow's
    logging). Everything else (a Python warning, a real error) is written back as it was."""
    if level < 1:
        yield
        return
    with filtered(2, lambda line: hidden_startup_line(line, level)):
        yield


def hidden_startup_line(line: str, level: int) -> bool:
    """Whether TF_CPP_MIN_LOG_LEVEL ``level`` hides ``line`` of TensorFlow's start-up."""
    match = _STARTUP_LINE.match(line)
    if match is None:
        return False
    severity = match.group(1) or "W"  # absl's preamble and the CPU notice's 2nd line: WARNING
    return {"I": 0, "W": 1, "E": 2, "F": 3}[severity] < level


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
