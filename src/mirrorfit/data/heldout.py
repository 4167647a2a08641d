"""A ``--data`` source's test split alone, for ``mirrorfit evaluate``: what scoring needs is
read, the training split as little as the source allows.

* ``mnist``: its test arrays; ``FILE.npz``: ``x_test`` and ``y_test`` alone (a file without
  ``x_train`` is scored too);
* an image ``FOLDER``: its ``test/`` subfolder. Beside ``train/``, labels index train/'s
  sorted class folders, as in training (train/ is listed, no image of it read). A folder of
  ``test/`` alone (``val/`` may be there too) is scored on its own: its class folders are the
  classes, so it needs one for every class the model was trained on, named as in training;
* ``package.module:function``: the function is called, and only its test split checked and
  read: a dataset's labels are checked batch by batch while it is scored, in one pass. An
  infinite dataset is refused up front; one of unknown length (``from_generator``) that has
  not ended after ``MAX_UNKNOWN_TEST`` examples is stopped with one line, not read for ever.

A source without a test split, or with a test split that has no examples, is one DataError
line naming the fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from mirrorfit.data import decode as decoding
from mirrorfit.data.folders import (check_not_empty, decode_errors, image_decoder, list_folder,
                                    split_folders)
from mirrorfit.data.images import eval_files, undecodable_files
from mirrorfit.data.opened import TestSplit
from mirrorfit.data.pipeline import eval_dataset, finish
from mirrorfit.data.spec import source_kind
from mirrorfit.errors import DataError

# Why a kind of source has no test split, and what to pass instead.
NO_TEST = {
    "synthetic": "random data has no test split",
    "tfrecord": "TFRecord sources are training examples only; write the test examples to an "
                "image FOLDER with a test/ subfolder or a FILE.npz with x_test/y_test",
    "npz": "the file has no x_test/y_test; add them, or pass a file that has them",
    "folder": "the folder has no test/ subfolder; give a folder holding test/ (one subfolder "
              "of images per class), beside train/ or alone, or a FILE.npz with x_test/y_test",
    "module": "the function returns no test split; return one (x_test, y_test or a dataset), "
              "or pass a FILE.npz with x_test/y_test",
}

# An unknown-length test dataset past this many examples is taken for an endless one: scoring
# keeps every example's result, so reading on would grow memory without end.
MAX_UNKNOWN_TEST = 10_000_000


def load_test(spec: str, *, batch: int, data_dir: str | None = None,
              image_size: tuple[int, int] | None = None, parallel: bool = True) -> TestSplit:
    """``spec``'s test split (a ``--data`` value), in batches of ``batch`` examples (the last
    one partial); ``data_dir`` and ``image_size`` are the flags of the same names."""
    kind = source_kind(spec)
    if kind == "mnist":
        from mirrorfit.data.mnist import load_mnist

        splits = load_mnist(data_dir)
        test = _arrays(spec, kind, splits.x_test, splits.y_test, batch, splits.source,
                       splits.source)
    elif kind == "npz":
        pair = _npz_test(spec)
        source = str(Path(spec).resolve())
        test = None if pair is None else _arrays(spec, kind, *pair, batch, source, source)
    elif kind == "module":
        test = _function(spec, batch)
    elif kind == "folder":
        test = _folder(spec, batch, image_size, parallel)
    else:
        test = None
    if test is None:
        raise DataError(f"--data {spec} has no test split to evaluate on: {NO_TEST[kind]}")
    return test


def _npz_test(spec: str) -> tuple[np.ndarray, np.ndarray] | None:
    """x_test and y_test of an npz, or None; nothing else is read, so a training split too
    large for memory (or absent: a file of the test split alone) is no obstacle."""
    from mirrorfit.data.npz import read_npz

    return read_npz(spec, splits=("test",)).get("test")


def _arrays(spec: str, kind: str, x: np.ndarray, y: np.ndarray, batch: int, source: str,
            what: str) -> TestSplit:
    y = np.asarray(y)
    if (y < 0).any():
        at = int(np.argmax(y < 0))
        raise DataError(f"--data {spec}: test label {y[at]} (example {at}) is negative; labels "
                        "are class indices 0..classes-1")
    classes = int(y.max()) + 1
    shape = tuple(x.shape[1:])
    # int64: a label past int32 must reach the range check, not wrap.
    test = eval_dataset(x, y.astype(np.int64), global_batch=batch)
    return TestSplit(test=test, input_shape=shape, num_classes=classes, kind=kind,
                     source=source,
                     description=f"{what}: {len(y):,} test examples of shape {shape}, labels "
                                 f"0-{classes - 1}")


def _function(spec: str, batch: int) -> TestSplit | None:
    from mirrorfit.data.user import call_user_function

    part = call_user_function(spec, check=("test",)).get("test")
    if part is None:
        return None
    if not isinstance(part, tf.data.Dataset):
        return _arrays(spec, "module", *part, batch, spec, f"{spec} (arrays)")
    shape = tuple(part.element_spec[0].shape)
    return TestSplit(test=finish(_bounded(part).batch(batch)), input_shape=shape, num_classes=None,
                     kind="module", source=spec,
                     description=f"{spec} (a dataset of test examples of shape {shape})")


def _bounded(ds: tf.data.Dataset) -> tf.data.Dataset:
    """``ds``, failing with one line at its ``MAX_UNKNOWN_TEST + 1``-th example when its length
    is unknown (evaluate names the source and says that reading its test split failed)."""
    if int(ds.cardinality()) != tf.data.UNKNOWN_CARDINALITY:
        return ds  # a known length ends; an infinite one was refused when checked
    limit = MAX_UNKNOWN_TEST
    message = (f"it had not ended after {limit:,} examples (an endless generator?); return a "
               "dataset that ends, or give its length with "
               "tf.data.experimental.assert_cardinality")

    def check(i, example):
        with tf.control_dependencies([tf.debugging.assert_less(i, tf.constant(limit, tf.int64),
                                                               message=message)]):
            return tf.nest.map_structure(tf.identity, example)

    return ds.enumerate().map(check)


def _folder(spec: str, batch: int, image_size: tuple[int, int] | None,
            parallel: bool) -> TestSplit | None:
    root = Path(spec)
    layout = split_folders(root, spec)
    if "test" not in layout:
        return None
    if "train" in layout:  # labels index train/'s class folders, as in training
        folder = list_folder(root, spec)
        check_not_empty(folder, "test", spec)
        test, first = folder.splits["test"], folder.splits["train"].paths[0]
    else:  # test/ alone: listed as a folder of class folders
        folder = list_folder(root / "test", spec)
        test = folder.splits["train"]
        first = test.paths[0]
    alone = "train" not in layout
    # The first training image sets the channels (and size), as it did in training.
    decoder = image_decoder(first, str(first), image_size, spec)

    def on_error(error):
        return decoding.explain(error, spec) or undecodable_files(test.paths, decoder, spec,
                                                                  error)

    classes = len(folder.class_names)
    return TestSplit(test=eval_files(test.paths, test.labels, decoder, batch=batch,
                                     parallel=parallel),
                     input_shape=decoder.shape, num_classes=classes, kind="folder",
                     source=str(root), class_names=folder.class_names,
                     _explain=decode_errors(on_error),
                     description=f"image folder {root} ({len(test):,} test images, {classes} "
                                 "classes" + (" from test/ alone" if alone else "")
                                 + f", decoded to {'x'.join(map(str, decoder.shape))})",
                     alone=alone)


__all__ = ["MAX_UNKNOWN_TEST", "NO_TEST", "load_test"]
