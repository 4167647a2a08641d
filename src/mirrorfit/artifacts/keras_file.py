"""A trained model as a ``.keras`` file (``--save-keras``), written whole or not at all, by
either engine: Keras's own format, no TensorFlow needed."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

from mirrorfit import _io
from mirrorfit.artifacts.output_paths import check_keras_path
from mirrorfit._frameworks import tensorflow_start_filtered


def save_keras(model, path: str | Path, *, before_commit: Callable[[], None] | None = None) -> Path:
    """Save a ``.keras`` file atomically and durably (temp file beside it, fsync, rename)."""
    path = check_keras_path(path)
    # Escaped: a stem like "model[1]" or "m.*" must only match its own temps.
    _io.remove_stale_temps(path.parent, re.escape(f".{path.stem}.tmp-"), re.escape(".keras"))
    tmp = path.with_name(f".{path.stem}.tmp-{_io.temp_tag()}.keras")
    try:
        # Keras's saving loads TensorFlow where it is installed, on the JAX engine too
        with _io.disk_full_hint(path, f"{path} is unchanged"), tensorflow_start_filtered():
            model.save(tmp)
            _io.fsync_tree(tmp)
        if before_commit:
            before_commit()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _io.fsync_dir(path.parent)
    return path


__all__ = ["save_keras"]
