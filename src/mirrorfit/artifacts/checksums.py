"""Checksums for a checkpoint folder, kept in its ``meta.json``: ``files`` (each other file's
path -> [bytes, CRC-32]) and ``crc`` (of the rest of meta.json itself). Written when the
checkpoint is committed, checked before a restore reads its state, so a flipped bit or a
truncated file is found and the checkpoint set aside, not restored. Both kinds of checkpoint
(``mirrorfit train``'s and ``mirrorfit.fit``'s) use them. (why: docs/checkpoints.md)
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

from mirrorfit import _io

META = "meta.json"


def file_sums(folder: Path) -> dict[str, list[int]]:
    """Every file below ``folder`` but meta.json: its path (relative, ``/``-separated) ->
    [size in bytes, CRC-32 of its bytes]."""
    sums = {}
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = Path(root, name)
            rel = path.relative_to(folder).as_posix()
            if rel != META:
                sums[rel] = [path.stat().st_size, _io.file_crc(path)]
    return sums


def sealed(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with its ``crc``: of its canonical JSON without that key."""
    body = {k: v for k, v in meta.items() if k != "crc"}
    return {**body, "crc": _meta_crc(body)}


def seal_problem(meta: dict[str, Any]) -> str | None:
    """What is wrong with ``meta``'s seal (missing, or not its content's), or None."""
    crc = meta.get("crc")
    if not isinstance(crc, int) or isinstance(crc, bool):
        return "meta.json has no checksum"
    body = {k: v for k, v in meta.items() if k != "crc"}
    if _meta_crc(body) != crc:
        return "meta.json does not match its checksum"
    return None


def files_problem(folder: Path, files: Any) -> str | None:
    """The first file of ``files`` (:func:`file_sums`' form) that is missing, of another size
    or whose bytes do not match their CRC-32 in ``folder``, or a file there it does not list;
    None when all match."""
    if not isinstance(files, dict) or not files:
        return "meta.json lists no files"
    for root, _, names in os.walk(folder):
        for name in names:
            rel = Path(root, name).relative_to(folder).as_posix()
            if rel != META and rel not in files:
                return f"{rel} is not among the files meta.json lists"
    for rel, want in files.items():
        if not (isinstance(rel, str) and isinstance(want, list) and len(want) == 2):
            return "meta.json's file list is malformed"
        path = folder / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            return f"meta.json names {rel!r}, outside the checkpoint"
        try:
            size = path.stat().st_size
            if size != want[0]:
                return f"{rel} has {size} bytes, {want[0]} when written"
            if _io.file_crc(path) != want[1]:
                return f"{rel} does not match its checksum: the data is damaged"
        except OSError as e:
            return f"{rel}: {e.strerror or type(e).__name__}"
    return None


def _meta_crc(body: dict[str, Any]) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())
