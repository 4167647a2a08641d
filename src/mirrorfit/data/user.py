"""``--data package.module:function``: a user's function of no arguments returning ``train``,
``(train, val)``, ``(train, val, test)`` (``val`` may be None) or a dict with ``"train"`` and
optional ``"val"``/``"validation"`` and ``"test"``. Each split is NumPy arrays ``(x, y)`` or a
``tf.data.Dataset`` of single unbatched examples; ``y``: class indices 0..classes-1; ``x``:
uint8 pixels (scaled to [0, 1]) or any number type (cast to float32).
(order and resume: docs/data.md; details: docs/architecture.md#data-sources)
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

# Lazily: a function's arrays are read with NumPy alone (the JAX engine, without TensorFlow).
from mirrorfit.data._tf import is_dataset, tf
from mirrorfit.data.arrays import check_pair
from mirrorfit.data.pipeline import DataOrder, finish, shuffle, worker_slice
from mirrorfit._frameworks import tensorflow_start_filtered
from mirrorfit.errors import DataError

if TYPE_CHECKING:
    from mirrorfit.data.opened import Data, TestSplit

SHUFFLE_BUFFER = 10_000  # examples


def call_user_function(
    spec: str, *, check: tuple[str, ...] = ("train", "val", "test")
) -> dict[str, Any]:
    """Import and call ``spec``; its splits as ``{"train": ..., "val": ..., "test": ...}``
    (absent ones left out), those named in ``check`` checked to be arrays ``(x, y)`` or a
    dataset of examples (evaluate checks only the test split: it reads no other, so a dict
    of ``"test"`` alone is accepted there; training's dict needs ``"train"``)."""
    module_name, _, attr = spec.partition(":")
    try:
        with tensorflow_start_filtered():  # a data module may import TensorFlow
            module = importlib.import_module(module_name)
    except SystemExit as e:  # no Exception: it would end the run with its code, no line
        raise DataError(
            f"--data {spec}: importing {module_name} exited (SystemExit: "
            f"{e.code}); a data module must not call sys.exit"
        ) from None
    except Exception as e:  # ImportError, or the module's own code failing
        raise DataError(
            f"--data {spec}: cannot import {module_name} ({type(e).__name__}: "
            f"{_short(e)}); is it on PYTHONPATH?"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise DataError(f"--data {spec}: module {module_name} has no function {attr}")
    try:
        with tensorflow_start_filtered():  # its body may import TensorFlow too
            result = fn()
    except SystemExit as e:  # exit 0 with nothing trained, else
        raise DataError(
            f"--data {spec}: the function exited (SystemExit: {e.code}) instead of "
            "returning the data"
        ) from None
    except Exception as e:
        raise DataError(
            f"--data {spec}: the function raised {type(e).__name__}: {_short(e)}"
        ) from None
    splits = _splits(spec, result, need_train="train" in check)
    for name, split in splits.items():
        if name in check:
            _check_split(spec, name, split)
    return splits


def _splits(spec: str, result: Any, need_train: bool = True) -> dict[str, Any]:
    expected = (
        "expected train, (train, val), (train, val, test) or a dict with 'train'"
        + ("" if need_train else " or 'test'")
        + ", each (x, y) NumPy arrays or a tf.data.Dataset of (x, y) examples"
    )
    if isinstance(result, dict):
        unknown = set(result) - {"train", "val", "validation", "test"}
        missing = "train" not in result and (need_train or "test" not in result)
        if missing or unknown or ("val" in result and "validation" in result):
            raise DataError(f"--data {spec} returned a dict with keys {sorted(result)}; {expected}")
        named = {"val" if k == "validation" else k: v for k, v in result.items()}
    elif _is_split(result):
        named = {"train": result}
    elif isinstance(result, (tuple, list)) and 1 <= len(result) <= 3:
        named = dict(zip(("train", "val", "test"), result))
    else:
        raise DataError(f"--data {spec} returned {type(result).__name__}; {expected}")
    return {k: v for k, v in named.items() if v is not None}


def _is_split(value: Any) -> bool:
    return is_dataset(value) or (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(a, np.ndarray) for a in value)
    )


def _check_split(spec: str, name: str, split: Any) -> None:
    where = f"--data {spec}: its {name} split"
    if is_dataset(split):
        element = split.element_spec
        if not (
            isinstance(element, tuple)
            and len(element) == 2
            and all(isinstance(s, tf.TensorSpec) for s in element)
        ):
            raise DataError(
                f"{where} is a dataset of {element}; it must yield (x, y) pairs of tensors"
            )
        x, y = element
        if y.shape.rank != 0 or not y.dtype.is_integer:
            raise DataError(
                f"{where} yields labels of shape {y.shape} and dtype {y.dtype.name}; "
                "give single examples (not batches) with integer class labels"
            )
        if (
            not (x.dtype.is_integer or x.dtype.is_floating)
            or not x.shape.is_fully_defined()
            or x.shape.num_elements() == 0
        ):
            raise DataError(
                f"{where} yields x of shape {x.shape} and dtype {x.dtype.name}; "
                "every example needs one fixed, non-empty shape of numbers"
            )
        if split.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise DataError(f"{where} is infinite (repeated?); return one pass over the data")
        return
    if not _is_split(split):
        raise DataError(
            f"{where} is {type(split).__name__}; give (x, y) NumPy arrays or a "
            "tf.data.Dataset of (x, y) examples"
        )
    x, y = split
    check_pair(
        x,
        y,
        f"{where}'s x",
        f"{where}'s y",
        "give integer class indices, shape (N,) (not one-hot)",
        scalar_examples=True,
    )


def dataset_held_out(
    ds: tf.data.Dataset, fraction: float, seed: int
) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """(train, val) of a dataset of examples: ``--validation-split fraction``'s examples
    drawn with ``seed`` (:func:`mirrorfit.data.files.holdout`; the examples counted in one
    pass), each in the dataset's order."""
    from mirrorfit.data.files import holdout

    n = len(labels_of(ds))
    return _split_by(ds, holdout(n, fraction, seed)[1], n)


def _split_by(
    ds: tf.data.Dataset, held: np.ndarray, n: int
) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """(the examples of ``ds`` (``n`` of them) not at the indices ``held``, those at them),
    each in order."""
    mask = np.zeros(n, bool)
    mask[held] = True
    keep = tf.constant(mask)
    val = ds.enumerate().filter(lambda i, _: keep[i]).map(lambda i, e: e)
    return ds.enumerate().filter(lambda i, _: ~keep[i]).map(lambda i, e: e), val


def labels_of(ds: tf.data.Dataset) -> np.ndarray:
    """Every label of a dataset of examples, in order (int64): one pass over it at start, to
    count the examples and check the labels' range (the inputs are computed, not kept)."""
    parts = [y for y in ds.map(lambda x, y: tf.cast(y, tf.int64)).batch(4096).as_numpy_iterator()]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


@dataclass(frozen=True, eq=False)
class DatasetBatches:
    """Training batches from a user's dataset of examples (see the module's docstring)."""

    examples_ds: tf.data.Dataset
    examples: int
    global_batch: int
    seed: int
    fingerprint: str
    cache: str | None = None

    @property
    def steps_per_epoch(self) -> int:
        return self.examples // self.global_batch

    @cached_property
    def order(self) -> DataOrder:
        return DataOrder(
            seed=self.seed,
            examples=self.examples,
            global_batch=self.global_batch,
            fingerprint=self.fingerprint,
        )

    @cached_property
    def _base(self) -> tf.data.Dataset:
        # One dataset object for the run: its cache (tf.data's) is filled once and shared by
        # every epoch and every pipeline built on it.
        ds = self.examples_ds.take(self.examples)
        if self.cache == "memory":
            return ds.cache()
        if self.cache:
            Path(self.cache).mkdir(parents=True, exist_ok=True)
            return ds.cache(str(Path(self.cache) / f"mirrorfit-{self.fingerprint}"))
        return ds

    def dataset(
        self,
        *,
        start_epoch: int = 0,
        epochs: int = 1,
        skip: int = 0,
        worker: int = 0,
        workers: int = 1,
    ) -> tf.data.Dataset:
        """The trainer's protocol; each worker reads every example and keeps its share."""
        if not 0 <= skip <= self.steps_per_epoch:
            raise ValueError(f"skip {skip} is outside an epoch of {self.steps_per_epoch} steps")
        base, buffer = self._base, max(1, min(self.examples, SHUFFLE_BUFFER))

        def epoch(e):
            ds = shuffle(
                base, buffer, seed=self.seed * 1_000_003 + e, reshuffle_each_iteration=False
            )
            return ds.batch(self.global_batch, drop_remainder=True)

        ds = tf.data.Dataset.range(start_epoch, epochs).flat_map(epoch).skip(skip)
        if workers > 1:
            ds = ds.map(
                lambda x, y: (worker_slice(x, worker, workers), worker_slice(y, worker, workers))
            )
        return finish(ds)

    def sampled(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        """For parameter-server workers: endless global batches, seeded per worker."""
        seed = tf.cast(context.input_pipeline_id, tf.int64) + self.seed * 1000
        buffer = max(1, min(self.examples, SHUFFLE_BUFFER))
        ds = shuffle(self.examples_ds, buffer, seed=seed).repeat()
        return finish(ds.batch(self.global_batch, drop_remainder=True))


def dataset_fingerprint(spec: str, ds: tf.data.Dataset, examples: int) -> str:
    """What can be known of a user's dataset without reading it twice: the function's name,
    the example count and the element spec (a changed body with the same shape is not seen)."""
    text = f"{spec}|{examples}|{ds.element_spec}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _short(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else "no message"


__all__ = [
    "DatasetBatches",
    "call_user_function",
    "dataset_fingerprint",
    "labels_of",
    "SHUFFLE_BUFFER",
]


# An unknown-length test dataset past this many examples is taken for an endless one: scoring
# keeps every example's result, so reading on would grow memory without end.
MAX_UNKNOWN_TEST = 10_000_000


def open_train(o) -> Data:
    """The function's splits for training: arrays (in-memory order) or datasets; ``o``:
    :class:`mirrorfit.data.arrays.Options`."""
    from mirrorfit.data.arrays import from_arrays
    from mirrorfit.data.opened import Data

    splits = call_user_function(o.spec)
    if all(isinstance(s, tuple) or isinstance(s, list) for s in splits.values()):
        if o.cache:
            raise DataError(
                f"--data {o.spec} returned NumPy arrays, already in memory; drop --cache"
            )
        data = from_arrays(
            o, {k: tuple(v) for k, v in splits.items()}, source=o.spec, what=f"{o.spec} (arrays)"
        )
        return dataclasses.replace(data, returned=splits)
    train = splits["train"]
    if not is_dataset(train):
        train = tf.data.Dataset.from_tensor_slices(tuple(train))
    labels = {"train": labels_of(train)}
    val = splits.get("val")
    split = o.holdout(len(labels["train"]), val is not None)
    if split is not None:
        train, val = _split_by(train, split[1], len(labels["train"]))
        held = np.zeros(len(labels["train"]), bool)
        held[split[1]] = True
        labels = {"train": labels["train"][~held], "val": labels["train"][held]}
    n = o.first(len(labels["train"]))
    labels["train"] = labels["train"][:n]
    evals = {}
    for name, part in (("val", val), ("test", splits.get("test"))):
        if part is None:
            continue
        if is_dataset(part):
            labels.setdefault(name, labels_of(part))
            evals[name] = finish(part.batch(o.eval_batch))
        else:
            labels[name] = part[1]
            evals[name] = (part[0], part[1].astype(np.int32))
    classes = o.classes(labels)
    shape = tuple(train.element_spec[0].shape)
    o.check_shape(shape)
    fp = dataset_fingerprint(o.spec, train, n)
    batches = DatasetBatches(
        examples_ds=train.take(n),
        examples=n,
        global_batch=o.global_batch,
        seed=o.seed,
        fingerprint=fp,
        cache=o.cache,
    )
    return Data(
        returned=splits,
        train=batches,
        val=evals.get("val"),
        test=evals.get("test"),
        input_shape=shape,
        num_classes=classes,
        kind="module",
        source=o.spec,
        fingerprint=fp,
        description=f"{o.spec} (a dataset of {n:,} training examples of shape {shape}, "
        f"{classes} classes" + (f", cached in {o.cache}" if o.cache else "") + ")",
    )


def open_test(spec: str, *, batch: int, **_) -> TestSplit | None:
    """The function's test split alone, for ``mirrorfit evaluate`` (None: it returns none):
    only it is checked and read."""
    from mirrorfit.data.arrays import test_arrays
    from mirrorfit.data.opened import TestSplit

    part = call_user_function(spec, check=("test",)).get("test")
    if part is None:
        return None
    if not is_dataset(part):
        return test_arrays(spec, "module", *part, batch, spec, f"{spec} (arrays)")
    shape = tuple(part.element_spec[0].shape)
    return TestSplit(
        test=finish(_bounded(part).batch(batch)),
        input_shape=shape,
        num_classes=None,
        kind="module",
        source=spec,
        description=f"{spec} (a dataset of test examples of shape {shape})",
    )


def _bounded(ds: tf.data.Dataset) -> tf.data.Dataset:
    """``ds``, failing with one line at its ``MAX_UNKNOWN_TEST + 1``-th example when its length
    is unknown (evaluate names the source and says that reading its test split failed)."""
    if int(ds.cardinality()) != tf.data.UNKNOWN_CARDINALITY:
        return ds  # a known length ends; an infinite one was refused when checked
    limit = MAX_UNKNOWN_TEST
    message = (
        f"it had not ended after {limit:,} examples (an endless generator?); return a "
        "dataset that ends, or give its length with "
        "tf.data.experimental.assert_cardinality"
    )

    def check(i, example):
        with tf.control_dependencies(
            [tf.debugging.assert_less(i, tf.constant(limit, tf.int64), message=message)]
        ):
            return tf.nest.map_structure(tf.identity, example)

    return ds.enumerate().map(check)
