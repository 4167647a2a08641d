"""Small file helpers: durable atomic writes (temp in the same folder, fsync, rename, fsync the
folder), leftovers of crashed writers, and a clear "disk full" instead of a traceback."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import socket
import tempfile
import uuid
import zlib
from pathlib import Path
from typing import Any, Iterator

from mirrorfit.errors import StorageError

_NO_SPACE = os.strerror(errno.ENOSPC)  # TensorFlow maps ENOSPC to ResourceExhaustedError
# A temp name's tag: this host, the writer's process id, and a random part. Only names of
# exactly this shape are ever removed as leftovers, and only this host's: a process id says
# nothing about a writer on another host sharing the folder (NFS), and other tools' ".tmp-*"
# entries are not ours to delete.
_HOST = f"{zlib.crc32(socket.gethostname().encode()):08x}"
_TAG = r"(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-[0-9a-f]{32}"


def file_crc(path: str | Path) -> int:
    """CRC-32 of a file's bytes, read a MiB at a time."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` so readers see the old file or the whole new one, never half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with disk_full_hint(path), os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically. NaN and infinities (a diverged loss, a
    metric of no step) are written as null: Python's bare ``NaN`` is not JSON, and strict
    readers (jq, JavaScript, Go) refuse the whole file."""
    text = json.dumps(_finite(data), indent=2, sort_keys=True, allow_nan=False)
    write_bytes_atomic(path, (text + "\n").encode())


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new entry in folder ``path`` survive a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | Path) -> None:
    """fsync every file and folder under ``path`` (files written by TensorFlow or Keras, which
    do not fsync), so that renaming ``path`` into place commits complete data."""
    path = Path(path)
    if path.is_file():
        _fsync_file(path)
        return
    for folder, _, files in os.walk(path, topdown=False):
        for name in files:
            _fsync_file(Path(folder) / name)
        fsync_dir(folder)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_disk_full(error: BaseException) -> bool:
    """True for ENOSPC, raised by Python (OSError) or by TensorFlow (its message says so)."""
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return _NO_SPACE in str(getattr(error, "message", error))


@contextlib.contextmanager
def disk_full_hint(what: str | Path, keep: str = "") -> Iterator[None]:
    """Turn a full disk while writing ``what`` into one StorageError line; ``keep`` says what
    is still intact (e.g. the previous checkpoint)."""
    try:
        yield
    except StorageError:
        raise
    except Exception as e:
        if not is_disk_full(e):
            raise
        raise StorageError(
            f"disk full while writing {what}{'; ' + keep if keep else ''}; "
            "free some space and rerun"
        ) from None


def temp_tag() -> str:
    """A unique part for a temp name: ``HOST-PID-RANDOM`` (see :func:`remove_stale_temps`)."""
    return f"{_HOST}-{os.getpid()}-{uuid.uuid4().hex}"


def remove_stale_temps(folder: str | Path, before: str, after: str = "") -> list[Path]:
    """Remove leftovers of crashed writers in ``folder``: entries named exactly
    ``before + temp_tag() + after`` (``before``/``after`` are regexes; escape literal text)
    whose writer ran on this host and is gone. Anything else stays: other tools' temps,
    another host's, a live writer's."""
    folder, removed = Path(folder), []
    if not folder.is_dir():
        return removed
    shape = re.compile(before + _TAG + after)
    for p in folder.iterdir():
        m = shape.fullmatch(p.name)
        if not m or m["host"] != _HOST or _alive(int(m["pid"])):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or no such process id can exist
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
