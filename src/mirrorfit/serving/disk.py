"""What lies under a model's base path: its version folders, whether each holds a SavedModel
yet, and a fingerprint of a folder's files to tell when a copy into it has moved on. No
TensorFlow here: these run on every poll, and before TensorFlow loads."""

from __future__ import annotations

import os
from pathlib import Path

from mirrorfit.errors import ConfigError
from mirrorfit.serving.model_config import ModelConfig
from mirrorfit.artifacts.version_names import parse_version

# What TensorFlow's SavedModel loader reads first (tf.saved_model.contains_saved_model looks
# for the same two): a folder without either is a copy that has not got there yet.
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")


def version_folders(base: Path) -> dict[int, str]:
    """Version -> folder name, for child folders named by an int64 (``00000123`` is 123), as TF
    Serving reads them; where two names give one number, the first in order wins. OSError when
    ``base`` cannot be listed: not the same as no versions (TF Serving too keeps serving).
    """
    out: dict[int, str] = {}
    with os.scandir(base) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            version = parse_version(entry.name)  # the exporter's parser: what it writes, we see
            try:
                is_dir = version is not None and entry.is_dir()
            except OSError:  # removed while we looked
                continue
            if is_dir:
                out.setdefault(version, entry.name)
    return out


def has_saved_model(path: Path) -> bool:
    """Whether ``path`` holds a SavedModel file yet (two stats: cheap on every poll)."""
    return any(os.path.isfile(path / name) for name in SAVED_MODEL_FILES)


def content(path: Path) -> int:
    """A hash of the files under ``path`` (names, sizes, mtimes): changes as a copy goes on."""
    entries = []
    for root, _, files in os.walk(path):
        for f in files:
            try:
                st = os.stat(os.path.join(root, f))
            except OSError:  # removed while we looked
                continue
            entries.append(
                (os.path.relpath(os.path.join(root, f), path), st.st_size, st.st_mtime_ns)
            )
    return hash(tuple(sorted(entries)))


def check_versions_present(configs: list[ModelConfig]) -> None:
    """--servable_versions_always_present: every model has a version folder under its base
    path now (TF Serving refuses to start, or to reload its config, otherwise)."""
    for config in configs:
        try:
            found = version_folders(Path(config.base_path))
        except OSError as e:
            found, why = {}, f"cannot read it: {type(e).__name__}: {e.strerror or e}"
        else:
            why = "no version folders (numeric names) in it"
        if not found:
            raise ConfigError(
                f"--servable_versions_always_present: model {config.name!r} has "
                f"no versions under {config.base_path} ({why})"
            )


__all__ = [
    "SAVED_MODEL_FILES",
    "check_versions_present",
    "content",
    "has_saved_model",
    "version_folders",
]
