"""Listing an image folder, fingerprinting files, and holding out a validation split: plain
Python and NumPy, no TensorFlow. An image folder has
``keras.utils.image_dataset_from_directory``'s layout (label i is the i-th class folder by
name), or ``train`` (required), ``val``/``validation`` and ``test`` subfolders in that layout.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from mirrorfit.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_SPLITS = {"train": "train", "val": "val", "validation": "val", "test": "test"}


@dataclass(frozen=True)
class FileSplit:
    """One split's examples: a file per example (paths as str) and its int32 label."""

    paths: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, index: np.ndarray) -> "FileSplit":
        return FileSplit(self.paths[index], self.labels[index])


@dataclass(frozen=True)
class ImageFolder:
    """An image folder's classes and splits (``train``; ``val`` and ``test`` when it has
    them), and a fingerprint of every file's name, size and modification time."""

    root: Path
    class_names: tuple[str, ...]
    splits: dict[str, FileSplit] = field(default_factory=dict)
    fingerprint: str = ""


def list_image_folder(root: str | Path, flag: str) -> ImageFolder:
    """List ``root``; DataError (naming ``flag``'s value and the fix) for an empty folder, a
    class folder without images, fewer than two classes, or val/test classes train lacks."""
    root = Path(root)
    subfolders = _subfolders(root, flag)
    names = {p.name for p in subfolders}
    if "train" in names and names <= set(_SPLITS):
        tops = {_SPLITS[p.name]: p for p in subfolders}
        if "validation" in names and "val" in names:
            raise DataError(f"--data {flag}: has both val/ and validation/; keep one")
    else:
        tops = {"train": root}
    classes = tuple(p.name for p in _subfolders(tops["train"], flag))
    if not classes:
        loose = any(
            os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES
            for e in _entries(tops["train"], flag)
        )
        raise DataError(
            f"--data {flag}: no class subfolders in {tops['train']}"
            + (" (its images must be in one subfolder per class)" if loose else "")
            + "; an image folder has one subfolder of PNG/JPEG images per class "
            "(keras.utils.image_dataset_from_directory's layout); for TFRecord "
            f"files give a pattern such as '{root}/*.tfrecord'"
        )
    if len(classes) < 2:
        raise DataError(
            f"--data {flag}: only one class folder ({classes[0]}); a classifier "
            "needs at least 2 classes, one subfolder each"
        )
    digest = hashlib.blake2b(digest_size=8)
    digest.update("\0".join(classes).encode())
    walked = _owned_folders(root, tops, flag)
    splits = {}
    for split, top in sorted(tops.items()):
        present = {p.name for p in _subfolders(top, flag)}
        extra = sorted(present - set(classes))
        if extra:
            raise DataError(
                f"--data {flag}: {top} has class folder(s) {', '.join(extra)} that "
                f"{tops['train']} has not; every split needs the same classes"
            )
        paths, labels = [], []
        for label, name in enumerate(classes):
            if name not in present:
                continue  # a val/test split may lack a class; train has them all
            found = _images(top / name, digest, root, flag, walked)
            if not found:
                # Not "remove it": label i is the i-th class folder, so removing one
                # silently renumbers the classes after it.
                raise DataError(
                    f"--data {flag}: class folder {top / name} holds no PNG or "
                    "JPEG image; add images (removing the folder renumbers the "
                    "classes after it)"
                )
            paths += found
            labels += [label] * len(found)
        splits[split] = FileSplit(np.array(paths, dtype=object), np.array(labels, np.int32))
    return ImageFolder(
        root=root, class_names=classes, splits=splits, fingerprint=digest.hexdigest()
    )


def _key(path: Path, flag: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataError(
            f"--data {flag}: cannot read {path} ({e.strerror}); check the path and its permissions"
        ) from None
    return st.st_dev, st.st_ino


def _owned_folders(root: Path, tops: dict[str, Path], flag: str) -> dict[tuple[int, int], Path]:
    """The folders a listing reads as such, by (device, inode): root's parents, root, the
    split folders and every class folder. A walk below a class folder that reaches one of
    them again (a link up or across) would list images twice, under another label."""
    owned: dict[tuple[int, int], Path] = {}
    for parent in reversed(Path(os.path.abspath(root)).parents):
        try:
            owned[_key(parent, flag)] = parent
        except DataError:  # a parent we may not stat: nothing below it can be a loop to it
            pass
    owned[_key(root, flag)] = root
    for top in tops.values():
        for folder in [top, *_subfolders(top, flag)]:
            key = _key(folder, flag)
            if key in owned and owned[key] != folder and folder != root:
                raise DataError(
                    f"--data {flag}: {folder} is the same folder as {owned[key]} "
                    "(a link); its images would be listed twice, under two "
                    "labels: remove the link"
                )
            owned[key] = folder
    return owned


def _entries(folder: Path, flag: str) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError as e:
        raise DataError(
            f"--data {flag}: cannot read {folder} ({e.strerror}); check the path "
            "and its permissions"
        ) from None


def _subfolders(folder: Path, flag: str) -> list[Path]:
    return [Path(e.path) for e in _entries(folder, flag) if _is_dir(e)]


def _is_dir(entry: os.DirEntry) -> bool:
    # False for a dangling link (no OSError) and for a link loop (ELOOP): neither is a folder
    try:
        return entry.is_dir()
    except OSError:
        return False


def _images(
    folder: Path, digest, root: Path, flag: str, walked: dict[tuple[int, int], Path]
) -> list[str]:
    """PNG/JPEG files under ``folder`` (subfolders too, hidden ones left out), sorted by path; each
    file's name relative to ``root``, size and mtime go into ``digest``. A subfolder already in
    ``walked`` (by device and inode) is refused naming the link, and so is an image name that is
    not a regular file. (why: docs/architecture.md#data-sources)
    """
    found = []
    stack = [folder]
    while stack:
        here = stack.pop()
        subs = []
        for entry in _entries(here, flag):
            if _is_dir(entry):
                sub = Path(entry.path)
                key = _key(sub, flag)
                if key in walked:
                    raise DataError(
                        f"--data {flag}: {sub} leads to {walked[key]}, a folder "
                        "this listing already reads; its images would be listed "
                        "twice, under another label: remove the link"
                    )
                walked[key] = sub
                subs.append(sub)
            elif os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES:
                try:
                    st = entry.stat()
                except OSError as e:  # a dangling link, no permission
                    raise DataError(
                        f"--data {flag}: cannot read {entry.path} ({e.strerror}); fix or remove it"
                    ) from None
                if not stat.S_ISREG(st.st_mode):
                    raise DataError(
                        f"--data {flag}: {entry.path} is not a regular file (a "
                        "FIFO, device or other special file); replace it with the "
                        "image file or remove it"
                    )
                found.append(entry.path)
                rel = os.path.relpath(entry.path, root)
                digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        stack.extend(reversed(subs))
    return sorted(found)


def files_fingerprint(paths: Iterable[str], extra: str = "") -> str:
    """A short hash of files' names, sizes and modification times (and ``extra``): another
    file, or one rewritten, gives another value. No file is read."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(extra.encode())
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as e:
            raise DataError(f"cannot read {path} ({e.strerror}); check --data") from None
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def holdout(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) example indices for ``--validation-split fraction``: exactly
    round(fraction x n) examples (at least 1, at most n - 1) drawn with ``seed``, each set in
    the source's order. The same seed, count and fraction always give the same split."""
    k = min(max(round(fraction * n), 1), n - 1)
    if n < 2:
        raise DataError(f"--validation-split needs at least 2 training examples, got {n}")
    # A stream of its own ([seed, 1 << 32]), apart from the epochs' ([seed, epoch]).
    chosen = np.random.default_rng([seed, 1 << 32]).permutation(n)[:k]
    mask = np.zeros(n, bool)
    mask[chosen] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


__all__ = [
    "IMAGE_SUFFIXES",
    "FileSplit",
    "ImageFolder",
    "list_image_folder",
    "files_fingerprint",
    "holdout",
]
