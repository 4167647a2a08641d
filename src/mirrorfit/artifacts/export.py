"""Versioned, atomic SavedModel export for TF Serving (``models/NAME/0001``, ``0002``, ...): a
version is written into a hidden folder and renamed into place. ``serving_default``:
``images`` -> ``probabilities`` (float32, one row per image); with named classes also the
asset ``assets/class_names.txt`` (UTF-8, label i on line i) and the ``classify`` and
``classes`` signatures. (why and the signatures: docs/architecture.md#export)
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from mirrorfit import _io
from mirrorfit.errors import StorageError
from mirrorfit.artifacts.output_paths import check_export_dir
from mirrorfit.artifacts.version_names import MAX_VERSION, parse_version, version_number

INPUT_NAME = "images"
OUTPUT_NAME = "probabilities"
CLASS_NAMES_FILE = "class_names.txt"  # in the version's assets/
CLASSIFY_METHOD = "tensorflow/serving/classify"
_MAX_RACES = 1000


def versions(base: str | Path) -> list[int]:
    """Version numbers under ``base`` as TF Serving sees them (folders named by ASCII digits
    that fit in int64: :func:`~mirrorfit.artifacts.version_names.parse_version`), sorted."""
    found = (parse_version(p.name) for p in _numbered(base) if p.is_dir())
    return sorted(v for v in found if v is not None)


def _numbered(base: str | Path) -> list[Path]:
    """Children of ``base`` named by ASCII digits, folders or not, of any size (a file named
    ``0002`` takes that number too: a version cannot be renamed onto it)."""
    base = Path(base)
    if not base.is_dir():
        return []
    return [p for p in base.iterdir() if version_number(p.name) is not None]


def _next_version(base: Path) -> int:
    """One past the largest number under ``base``; StorageError if TF Serving could not read
    it (past int64: the server would ignore the version and serve the older one)."""
    top = max(_numbered(base), key=lambda p: version_number(p.name), default=None)
    version = version_number(top.name) + 1 if top is not None else 1
    if version > MAX_VERSION:
        raise StorageError(
            f"the next export version after {top} would be {version}, past the "
            f"largest TF Serving reads ({MAX_VERSION}); move {top.name} out of "
            f"{base} or export to another folder"
        )
    return version


def export_saved_model(
    model: keras.Model,
    base: str | Path,
    *,
    preprocessing: bool = False,
    class_names: Sequence[str] | None = None,
    before_commit: Callable[[], None] | None = None,
) -> Path:
    """Write ``model`` as the next numeric version under ``base``; return its path.
    ``preprocessing``: the signature takes raw uint8 pixels (else float32 in [0, 1]);
    ``class_names``: label i's name at i (the asset and signatures); ``before_commit`` runs just
    before the rename, and if it raises nothing is added. StorageError if the disk is full.
    """
    base = check_export_dir(base)
    base.mkdir(parents=True, exist_ok=True)
    shape = (None, *model.input_shape[1:])
    dtype = tf.uint8 if preprocessing else tf.float32

    def probabilities(images):
        x = tf.cast(images, tf.float32) / 255.0 if preprocessing else images
        return tf.cast(model(x, training=False), tf.float32)

    def serve(images):
        return {OUTPUT_NAME: probabilities(images)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serving_default", serve, input_signature=[tf.TensorSpec(shape, dtype, name=INPUT_NAME)]
    )
    names_dir = Path(tempfile.mkdtemp()) if class_names else None

    def write(folder: Path) -> None:
        if class_names and names_dir is not None:
            _add_class_names(
                archive,
                probabilities,
                shape,
                dtype,
                list(class_names),
                int(model.output_shape[-1]),
                names_dir,
            )
        archive.write_out(str(folder), verbose=False)
        if class_names:
            _mark_classify(folder)

    try:
        return _write_version(base, write, before_commit)
    finally:
        if names_dir:
            shutil.rmtree(names_dir, ignore_errors=True)


def export_keras_model(
    model: keras.Model, base: str | Path, *, before_commit: Callable[[], None] | None = None
) -> Path:
    """Write a user's ``model`` as the next numeric version under ``base``, with the signature
    Keras's own ``model.export()`` gives it (``serving_default``: the model's inputs, by name,
    as it was trained on them -> its outputs); return its path. StorageError if the disk is
    full."""
    from keras.src.export.saved_model import export_saved_model as keras_export

    base = check_export_dir(base)
    base.mkdir(parents=True, exist_ok=True)
    return _write_version(
        base, lambda folder: keras_export(model, str(folder), verbose=False), before_commit
    )


def _write_version(
    base: Path, write: Callable[[Path], None], before_commit: Callable[[], None] | None
) -> Path:
    """``write(folder)`` into a hidden folder under ``base``, synced, then renamed to the next
    version: a version appears whole or not at all."""
    _next_version(base)  # refuse before the write if no number is left
    _io.remove_stale_temps(base, re.escape(".tmp-"))
    tmp = base / f".tmp-{_io.temp_tag()}"  # not mkdtemp: its 0700 hides the version from a
    tmp.mkdir()  # server running as another user
    try:
        with _io.disk_full_hint(f"the export under {base}", "no version was added"):
            write(tmp)
            _io.fsync_tree(tmp)  # TF does not fsync: a power loss could leave half a version
        return _commit(tmp, base, before_commit)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left behind if it did not commit


def _add_class_names(
    archive, probabilities, shape, dtype, names: list[str], count: int, folder: Path
) -> None:
    """The asset and the ``classify`` and ``classes`` endpoints. Line breaks inside a name
    (a folder may be named so) are written as ``\\n``: one name per line. ``count``: the
    model's outputs (``--num-classes`` may give more than there are names: those are "")."""
    path = folder / CLASS_NAMES_FILE
    path.write_text(
        "".join(n.replace("\r", "\\r").replace("\n", "\\n") + "\n" for n in names), encoding="utf-8"
    )
    table = tf.lookup.StaticHashTable(
        tf.lookup.TextFileInitializer(
            str(path),
            tf.int64,
            tf.lookup.TextFileIndex.LINE_NUMBER,
            tf.string,
            tf.lookup.TextFileIndex.WHOLE_LINE,
        ),
        default_value="",
    )
    archive.track(table)  # its file becomes the SavedModel's asset
    pixels = int(np.prod(shape[1:]))

    def named(scores):
        classes = table.lookup(tf.range(count, dtype=tf.int64))
        rows = tf.shape(scores)[0]
        return tf.tile(classes[None], [rows, 1]), tf.gather(classes, tf.argmax(scores, 1))

    def classify(inputs):
        # TF Serving's classify: tf.Examples in, every class's name and score out.
        parsed = tf.io.parse_example(
            inputs, {INPUT_NAME: tf.io.FixedLenFeature([pixels], tf.float32)}
        )
        images = tf.cast(tf.reshape(parsed[INPUT_NAME], (-1, *shape[1:])), dtype)
        scores = probabilities(images)
        return {"classes": named(scores)[0], "scores": scores}

    def classes(images):
        scores = probabilities(images)
        every, top = named(scores)
        return {"label": top, "classes": every, "scores": scores}

    archive.add_endpoint(
        "classify", classify, input_signature=[tf.TensorSpec((None,), tf.string, name="inputs")]
    )
    archive.add_endpoint(
        "classes", classes, input_signature=[tf.TensorSpec(shape, dtype, name=INPUT_NAME)]
    )


def _mark_classify(folder: Path) -> None:
    """Give the ``classify`` signature TF Serving's classify method name (an endpoint is
    written as a predict one): TF Serving's classify API asks for it."""
    from tensorflow.core.protobuf import saved_model_pb2

    pb = folder / "saved_model.pb"
    proto = saved_model_pb2.SavedModel.FromString(pb.read_bytes())
    for graph in proto.meta_graphs:
        if "classify" in graph.signature_def:
            graph.signature_def["classify"].method_name = CLASSIFY_METHOD
    pb.write_bytes(proto.SerializeToString())


def _commit(tmp: Path, base: Path, before_commit: Callable[[], None] | None) -> Path:
    if before_commit:
        before_commit()
    for _ in range(_MAX_RACES):
        version = _next_version(base)
        final = base / f"{version:04d}"
        try:
            os.rename(tmp, final)  # the commit point
        except OSError as e:
            if os.path.lexists(final):  # another exporter took this number first: next one
                continue
            raise StorageError(f"cannot create export version {final}: {e.strerror}") from None
        _io.fsync_dir(base)
        return final
    raise StorageError(
        f"gave up finding a free version number under {base} after "
        f"{_MAX_RACES} tries (other exporters keep taking them)"
    )
