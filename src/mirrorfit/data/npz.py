"""``--data FILE.npz``: (x, y) arrays per split, each member's header checked before NumPy
allocates anything."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mirrorfit.data.arrays import check_pair
from mirrorfit.errors import DataError

if TYPE_CHECKING:
    from mirrorfit.data.arrays import Options
    from mirrorfit.data.opened import Data, TestSplit


def read_npz(
    path: str, splits: tuple[str, ...] = ("train", "val", "test")
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The (x, y) pairs of an npz file's ``splits`` ("train", "val", "test"): only those are
    read, and "train" is required when asked for. Each member's header is read first, so a
    shape the file does not hold the bytes for, Python objects, or more than the memory
    available is refused before NumPy allocates anything."""
    import psutil

    keys = [f"{xy}_{split}" for split in splits for xy in "xy"]
    try:
        with zipfile.ZipFile(path) as z:
            # Keyed as np.load keys them: the name without ".npy" ("a/x_test" is not x_test).
            members = {n[:-4]: z.getinfo(n) for n in z.namelist() if n.endswith(".npy")}
            total = sum(member_bytes(path, z, k, members[k]) for k in keys if k in members)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise DataError(
            f"--data {path} is not a readable npz file ({type(e).__name__}: "
            f"{str(e)[:200]}); save it with numpy.savez"
        ) from None
    if "train" in splits and ("x_train" not in members or "y_train" not in members):
        raise DataError(
            f"--data {path} has {_names(members)}; it needs x_train and y_train "
            "(and optionally x_val/y_val, x_test/y_test)"
        )
    available = psutil.virtual_memory().available
    if total > available:
        raise DataError(
            f"--data {path}: its arrays take {total / 2**30:.1f} GiB, more than the "
            f"{available / 2**30:.1f} GiB of memory available; store the data as "
            "image files or TFRecords, which are streamed"
        )
    out = {}
    with np.load(path, allow_pickle=False) as f:
        for split in splits:
            have = [k in members for k in (f"x_{split}", f"y_{split}")]
            if have == [True, False] or have == [False, True]:
                raise DataError(f"--data {path} has x_{split} or y_{split} but not both")
            if all(have):
                out[split] = (f[f"x_{split}"], f[f"y_{split}"])
    for split, (x, y) in out.items():
        check_pair(
            x,
            y,
            f"--data {path}: x_{split}",
            f"y_{split}",
            "give integer class indices of shape (N,) (not one-hot)",
        )
    return out


def _names(members) -> str:
    """A few of the file's array names, for a message (a file may hold thousands)."""
    names = sorted(members)
    shown = ", ".join(repr(n[:40]) for n in names[:6])
    return (shown + f" and {len(names) - 6} more" if len(names) > 6 else shown) or "no arrays"


def member_bytes(path: str, z: zipfile.ZipFile, key: str, info: zipfile.ZipInfo) -> int:
    with z.open(info) as f:
        version = np.lib.format.read_magic(f)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read(f)
        offset = f.tell()
    if dtype.hasobject:
        raise DataError(f"--data {path}: {key} holds Python objects (dtype {dtype}), not numbers")
    size = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if offset + size > info.file_size:
        raise DataError(
            f"--data {path}: {key} declares shape {shape} ({size:,} bytes) but holds "
            f"only {info.file_size - offset:,}; the file is damaged"
        )
    return size


__all__ = ["read_npz"]


def open_train(o: Options) -> Data:
    """An npz file's splits for training (in-memory order)."""
    from mirrorfit.data.arrays import from_arrays

    return from_arrays(o, read_npz(o.spec), source=str(Path(o.spec).resolve()))


def open_test(spec: str, *, batch: int, **_) -> TestSplit | None:
    """x_test and y_test alone, for ``mirrorfit evaluate`` (None: the file has none)."""
    from mirrorfit.data.arrays import test_arrays

    pair = _test_pair(spec)
    source = str(Path(spec).resolve())
    return None if pair is None else test_arrays(spec, "npz", *pair, batch, source, source)


def _test_pair(spec: str) -> tuple[np.ndarray, np.ndarray] | None:
    """x_test and y_test of an npz, or None; nothing else is read, so a training split too
    large for memory (or absent: a file of the test split alone) is no obstacle."""
    return read_npz(spec, splits=("test",)).get("test")
