"""What opening any ``--data`` source takes (:class:`Options`: the flags, and the checks every
kind makes with them), and sources that are NumPy arrays: :func:`from_arrays` for training
(``.npz`` files, a function's arrays), :func:`test_arrays` for ``mirrorfit evaluate``.

NumPy only: the JAX engine opens array sources here without TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from mirrorfit.data.opened import Data, TestSplit
from mirrorfit.data.pipeline import ShuffledBatches, eval_dataset
from mirrorfit.data.spec import KINDS, MAX_CLASSES
from mirrorfit.errors import DataError, FitError


@dataclass(frozen=True)
class Options:
    """What opening a source takes: the flags of :func:`mirrorfit.data.sources.load_data`,
    and the checks every kind makes with them."""

    spec: str
    kind: str
    data_dir: str | None
    global_batch: int
    seed: int
    workers: int
    eval_batch: int
    train_examples: int | None
    validation_split: float | None
    image_size: tuple[int, int] | None
    image_feature: str
    label_feature: str
    cache: str | None
    input_shape: tuple[int, ...] | None
    num_classes: int | None
    model: str
    parallel: bool
    raw: bool = False  # evaluation batches' pixels as decoded (uint8), not scaled to [0, 1]
    # called with the images' decoded shape before any is decoded (a compiled model's check)
    on_shape: Callable[[tuple[int, ...]], None] | None = None

    def first(self, n: int) -> int:
        """How many training examples to keep of ``n`` (``--train-examples``)."""
        if self.train_examples is None:
            return n
        if self.train_examples > n:
            raise DataError(
                f"--train-examples {self.train_examples} is more than the {n} "
                f"training examples of --data {self.spec}"
            )
        return self.train_examples

    def classes(self, labels: dict[str, np.ndarray]) -> int:
        """The number of classes: ``--num-classes``, else the largest label + 1; DataError for
        a negative label or one out of range, naming the split and the example."""
        top = -1
        for split, y in labels.items():
            if not len(y):
                continue
            low = int(np.argmin(y))
            if y[low] < 0:
                raise DataError(
                    f"--data {self.spec}: {split} label {y[low]} (example {low}) "
                    "is negative; labels are class indices 0, 1, ..."
                )
            high = int(np.argmax(y))
            if self.num_classes is not None and y[high] >= self.num_classes:
                raise DataError(
                    f"--data {self.spec}: {split} label {y[high]} (example {high}) "
                    f"is out of range for --num-classes {self.num_classes} (labels "
                    f"0-{self.num_classes - 1}); raise --num-classes or fix the "
                    "labels"
                )
            if self.num_classes is None and y[high] >= MAX_CLASSES:
                raise DataError(
                    f"--data {self.spec}: {split} label {y[high]} (example {high}) "
                    f"would make {int(y[high]) + 1:,} classes, more than "
                    f"{MAX_CLASSES:,}; labels are class indices 0, 1, ...: fix "
                    "the labels"
                )
            top = max(top, int(y[high]))
        if self.num_classes is not None:
            return self.num_classes
        if top < 1:
            raise DataError(
                f"--data {self.spec}: every label is {max(top, 0)}; a classifier "
                "needs at least 2 classes"
            )
        return top + 1

    def holdout(self, n: int, has_val: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """(train, val) indices for --validation-split, or None without it."""
        from mirrorfit.data.files import holdout

        if self.validation_split is None:
            return None
        if has_val:
            raise DataError(
                f"--data {self.spec} has its own validation split; drop --validation-split"
            )
        return holdout(n, self.validation_split, self.seed)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        if self.input_shape is not None and tuple(self.input_shape) != tuple(shape):
            raise DataError(
                f"--input-shape {','.join(map(str, self.input_shape))} is not the "
                f"shape of --data {self.spec}'s examples "
                f"({','.join(map(str, shape))})"
                + ("; pass --image-size H,W to resize the images" if KINDS[self.kind].files else "")
                + " or drop --input-shape"
            )


def from_arrays(
    o: Options, arrays: dict[str, tuple[np.ndarray, np.ndarray]], *, source: str, what: str = ""
) -> Data:
    """Data from (x, y) arrays per split (npz, or a function's arrays): in-memory order."""
    x, y = arrays["train"]
    val = arrays.get("val")
    split = o.holdout(len(x), val is not None)
    if split is not None:
        train_idx, val_idx = split
        val = (x[val_idx], y[val_idx])
        x, y = x[train_idx], y[train_idx]
    n = o.first(len(x))
    x, y = x[:n], y[:n]  # the labels as given until their range is checked (no wrap-around)
    for name, pair in (("val", val), ("test", arrays.get("test"))):
        if pair is not None and pair[0].shape[1:] != x.shape[1:]:
            raise DataError(
                f"--data {o.spec}: x_{name} examples have shape "
                f"{pair[0].shape[1:]}, x_train's {x.shape[1:]}; every split needs "
                "the same shape"
            )
    o.check_shape(x.shape[1:])
    present = {
        "train": y,
        **{k: v[1] for k, v in (("val", val), ("test", arrays.get("test"))) if v is not None},
    }
    classes = o.classes(present)
    y = y.astype(np.int32)
    val = None if val is None else (val[0], val[1].astype(np.int32))
    test = arrays.get("test")
    test = None if test is None else (test[0], test[1].astype(np.int32))
    train = ShuffledBatches(x=x, y=y, global_batch=o.global_batch, seed=o.seed)
    counts = ", ".join(
        f"{len(v[1]):,} {k}"
        for k, v in (("train", (x, y)), ("val", val), ("test", test))
        if v is not None
    )
    return Data(
        train=train,
        val=val,
        test=test,
        input_shape=tuple(x.shape[1:]),
        num_classes=classes,
        kind=o.kind,
        source=source,
        description=f"{what or source}: {counts} examples of shape "
        f"{tuple(x.shape[1:])}, {classes} classes",
        fingerprint=train.order.fingerprint,
    )


def test_arrays(
    spec: str, kind: str, x: np.ndarray, y: np.ndarray, batch: int, source: str, what: str
) -> TestSplit:
    y = np.asarray(y)
    if (y < 0).any():
        at = int(np.argmax(y < 0))
        raise DataError(
            f"--data {spec}: test label {y[at]} (example {at}) is negative; labels "
            "are class indices 0..classes-1"
        )
    classes = int(y.max()) + 1
    shape = tuple(x.shape[1:])
    # int64: a label past int32 must reach the range check, not wrap.
    test = eval_dataset(x, y.astype(np.int64), global_batch=batch)
    return TestSplit(
        test=test,
        input_shape=shape,
        num_classes=classes,
        kind=kind,
        source=source,
        description=f"{what}: {len(y):,} test examples of shape {shape}, labels 0-{classes - 1}",
    )


def check_pair(
    x: np.ndarray,
    y: np.ndarray,
    x_name: str,
    y_name: str,
    fix: str,
    *,
    scalar_examples: bool = False,
) -> None:
    """DataError, one line, unless ``x`` holds N examples of numbers (of one non-empty shape;
    ``scalar_examples``: single numbers, x of shape (N,), too) and ``y`` N integer class
    indices, shape (N,). ``x_name``/``y_name`` name them in the message (``--data f.npz:
    x_train``); ``fix`` ends the message about the labels."""
    if x.ndim == 0 or y.ndim == 0:
        raise DataError(
            f"{x_name if x.ndim == 0 else y_name} is a single value (shape ()); "
            "give one entry per example, (N, ...)"
        )
    if len(x) != len(y) or not len(x):
        raise DataError(
            f"{x_name} has {len(x)} examples, {y_name} {len(y)} labels; each "
            "example needs exactly one label (and there must be some)"
        )
    # kind, not issubdtype: NumPy counts timedelta64 as an integer, and bool is no class index
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise DataError(f"{y_name} has shape {y.shape} and dtype {y.dtype}; {fix}")
    if x.ndim < (1 if scalar_examples else 2) or x.dtype.kind not in "iuf" or 0 in x.shape[1:]:
        raise DataError(
            f"{x_name} has shape {x.shape} and dtype {x.dtype}; give one "
            "non-empty array of numbers per example, (N, ...) in all"
        )


__all__ = ["Options", "from_arrays", "test_arrays", "check_pair"]


def output_classes(model) -> int | None:
    """The size of a model's (single) output's last axis, or None where it is not known."""
    try:
        shape = model.output_shape
    except (AttributeError, ValueError, RuntimeError):  # a subclassed model not yet called
        return None
    if isinstance(shape, (list, dict)) or not shape or shape[-1] is None:
        return None
    return int(shape[-1])


def is_sparse_categorical(loss) -> bool:
    """Whether ``loss`` (a Keras loss object, function or name) is sparse categorical
    crossentropy: the loss whose labels index the model's outputs."""
    import keras

    if isinstance(loss, keras.losses.SparseCategoricalCrossentropy):
        return True
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", None)
    return name in ("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy")


def check_class_labels(
    y, where: str, classes: int | None = None, ignored: int | None = None
) -> None:
    """FitError (a ValueError) for integer labels ``y`` outside ``[0, classes)`` (the
    model's outputs) but ``ignored`` (a sparse loss's ``ignore_class``): one-hot of it is all
    zeros, a loss of 0 on JAX (one output, a sigmoid's: not checked)."""
    if y is None:
        return
    y = np.asarray(y)
    if ignored is not None:  # the loss's ignore_class: any value, e.g. 255 or -1
        y = y[y != ignored]
    if classes and classes > 1 and y.size and (y.min() < 0 or y.max() >= classes):
        bad = int(y.min()) if y.min() < 0 else int(y.max())
        raise FitError(
            f"{where} has label {bad}, but the model has {classes} outputs (labels "
            f"0..{classes - 1}); give a model with as many outputs as classes, or "
            "labels that index them"
        )
