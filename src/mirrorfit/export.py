"""Versioned, atomic SavedModel export for TF Serving (``models/NAME/0001``, ``0002``, ...).

A version is written into a hidden folder beside the versions and renamed into place, so a
server polling ``models/NAME`` (TF Serving counts only children whose names parse as integers)
never sees half a version. The signature ``serving_default`` takes ``images`` and returns
``probabilities`` (float32, one row per image).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import keras
import tensorflow as tf

from mirrorfit.errors import ConfigError

INPUT_NAME = "images"
OUTPUT_NAME = "probabilities"


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
    """Version numbers present under ``base`` (children whose names are integers), sorted."""
    base = Path(base)
    if not base.is_dir():
        return []
    return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit() and p.is_dir())


def export_saved_model(model: keras.Model, base: str | Path, *,
                       preprocessing: bool = False) -> Path:
    """Write ``model`` as the next numeric version under ``base``; return its path.

    With ``preprocessing`` the signature takes raw uint8 pixels and scales them inside the
    model, so clients can send images as they are; otherwise float32 in [0, 1].
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
    while True:
        version = (versions(base) or [0])[-1] + 1
        tmp = base / f".tmp-{version:04d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        archive.write_out(str(tmp), verbose=False)
        try:
            os.rename(tmp, base / f"{version:04d}")  # the commit point
            return base / f"{version:04d}"
        except OSError:  # another exporter took this number first: take the next one
            shutil.rmtree(tmp, ignore_errors=True)


def save_keras(model: keras.Model, path: str | Path) -> Path:
    """Save a ``.keras`` file atomically (temp file beside it, then rename)."""
    path = check_keras_path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.keras")
    model.save(tmp)
    os.replace(tmp, path)
    return path
