"""Versioned, atomic SavedModel export for TF Serving (``models/NAME/0001``, ``0002``, ...).

A version is written into a hidden folder beside the versions and renamed into place, so a
server polling ``models/NAME`` (TF Serving counts only children whose names parse as integers)
never sees half a version. The signature ``serving_default`` takes ``images`` and returns
``probabilities`` (float32, one row per image).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Callable

import keras
import tensorflow as tf

from mirrorfit import _io
from mirrorfit.errors import ConfigError, StorageError

INPUT_NAME = "images"
OUTPUT_NAME = "probabilities"
_VERSION = re.compile(r"[0-9]+")
_MAX_RACES = 1000


def check_export_dir(base: str | Path) -> Path:
    """``base`` as a Path; ConfigError if it exists but is not a folder."""
    base = Path(base)
    if base.exists() and not base.is_dir():
        raise ConfigError(f"--export-dir {base} is a file; give a folder like models/mnist")
    return base


def check_keras_path(path: str | Path) -> Path:
    """``path`` as a Path; ConfigError unless it ends in .keras (Keras requires it)."""
    path = Path(path)
    if path.suffix != ".keras":
        raise ConfigError(f"--save-keras {path}: the file name must end in .keras")
    return path


def versions(base: str | Path) -> list[int]:
    """Version numbers present under ``base`` (folders named by ASCII digits only, as TF
    Serving counts them; ``str.isdigit`` would also take "²", which ``int`` rejects), sorted."""
    return sorted(int(p.name) for p in _numbered(base) if p.is_dir())


def _numbered(base: str | Path) -> list[Path]:
    """Children of ``base`` named like a version, folders or not (a file named ``0002`` takes
    that number too: a version cannot be renamed onto it)."""
    base = Path(base)
    if not base.is_dir():
        return []
    return [p for p in base.iterdir() if _VERSION.fullmatch(p.name)]


def export_saved_model(model: keras.Model, base: str | Path, *, preprocessing: bool = False,
                       before_commit: Callable[[], None] | None = None) -> Path:
    """Write ``model`` as the next numeric version under ``base``; return its path.

    With ``preprocessing`` the signature takes raw uint8 pixels and scales them inside the
    model, so clients can send images as they are; otherwise float32 in [0, 1].
    ``before_commit`` runs just before the version is renamed into place; if it raises (a
    signal arrived), nothing is added. StorageError if the disk is full.
    """
    base = check_export_dir(base)
    base.mkdir(parents=True, exist_ok=True)
    shape = (None, *model.input_shape[1:])
    dtype = tf.uint8 if preprocessing else tf.float32

    def serve(images):
        x = tf.cast(images, tf.float32) / 255.0 if preprocessing else images
        return {OUTPUT_NAME: tf.cast(model(x, training=False), tf.float32)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serve,
                         input_signature=[tf.TensorSpec(shape, dtype, name=INPUT_NAME)])
    _io.remove_stale_temps(base, ".tmp-*")
    tmp = base / f".tmp-{os.getpid()}-{uuid.uuid4().hex}"  # not mkdtemp: its 0700 hides the
    tmp.mkdir()  # version from a server running as another user
    try:
        with _io.disk_full_hint(f"the export under {base}", "no version was added"):
            archive.write_out(str(tmp), verbose=False)
            _io.fsync_tree(tmp)  # TF does not fsync: a power loss could leave half a version
        return _commit(tmp, base, before_commit)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left behind if it did not commit


def _commit(tmp: Path, base: Path, before_commit: Callable[[], None] | None) -> Path:
    if before_commit:
        before_commit()
    for _ in range(_MAX_RACES):
        version = max((int(p.name) for p in _numbered(base)), default=0) + 1
        final = base / f"{version:04d}"
        try:
            os.rename(tmp, final)  # the commit point
        except OSError as e:
            if os.path.lexists(final):  # another exporter took this number first: next one
                continue
            raise StorageError(f"cannot create export version {final}: {e.strerror}") from None
        _io.fsync_dir(base)
        return final
    raise StorageError(f"gave up finding a free version number under {base} after "
                       f"{_MAX_RACES} tries (other exporters keep taking them)")


def save_keras(model: keras.Model, path: str | Path, *,
               before_commit: Callable[[], None] | None = None) -> Path:
    """Save a ``.keras`` file atomically and durably (temp file beside it, fsync, rename)."""
    path = check_keras_path(path)
    _io.remove_stale_temps(path.parent, f".{path.stem}.tmp-*.keras")
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.keras")
    try:
        with _io.disk_full_hint(path, f"{path} is unchanged"):
            model.save(tmp)
            _io.fsync_tree(tmp)
        if before_commit:
            before_commit()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _io.fsync_dir(path.parent)
    return path
