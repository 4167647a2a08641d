"""``--data SOURCE`` -> one frozen :class:`Data`: training batches, validation and test data, the
input shape, the number of classes, a line for the log and a fingerprint for checkpoints.

Sources (``mirrorfit.data.spec.source_kind`` tells which a value is):

* ``mnist``: keras.datasets.mnist's file (``--data-dir``, ``$MIRRORFIT_DATA``, the Keras cache,
  a download); validation = the first 5,000 training images, as in the chapter;
* ``FILE.npz``: ``x_train``, ``y_train`` and optional ``x_val``/``y_val``, ``x_test``/``y_test``;
* an image ``FOLDER``: one subfolder per class (:mod:`mirrorfit.data.folders`, listed by
  :mod:`mirrorfit.data.files`), read by index (:mod:`mirrorfit.data.images`);
* ``'GLOB.tfrecord'``: tf.train.Example records, streamed (:mod:`mirrorfit.data.records`);
* ``package.module:function``: arrays or datasets (:mod:`mirrorfit.data.user`);
* ``synthetic``: random batches (:mod:`mirrorfit.data.synthetic`).

A source without a validation split takes one with ``--validation-split F`` (seeded, exactly
round(F x N) examples, :func:`mirrorfit.data.files.holdout`); else it has none. Every check a
user can fail here raises DataError (one line, exit 2): labels out of range or negative,
mismatched lengths, shapes, damaged files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from mirrorfit.data import decode as decoding
from mirrorfit.data.files import files_fingerprint, holdout
from mirrorfit.data.folders import decode_errors, image_decoder, open_folder
from mirrorfit.data.images import IndexedBatches, fill_store, store_key
from mirrorfit.data.mnist import load_mnist
from mirrorfit.data.npz import read_npz
from mirrorfit.data.opened import Data
from mirrorfit.data.pipeline import ShuffledBatches, finish
from mirrorfit.data.records import (RecordBatches, eval_records, parse_fn, records_in_order,
                                    scan_records, undecodable_records)
from mirrorfit.data.spec import source_kind, tfrecord_files
from mirrorfit.data.user import DatasetBatches, call_user_function, dataset_fingerprint, labels_of
from mirrorfit.errors import DataError

SYNTHETIC_STEPS = 100  # global batches per synthetic epoch unless --train-examples says


def load_data(spec: str = "mnist", *, global_batch: int, seed: int = 42, workers: int = 1,
              eval_batch: int | None = None, data_dir: str | None = None,
              train_examples: int | None = None, validation_split: float | None = None,
              image_size: tuple[int, int] | None = None, image_feature: str = "image/encoded",
              label_feature: str = "image/class/label", cache: str | None = None,
              input_shape: tuple[int, ...] | None = None, num_classes: int | None = None,
              model: str = "mlp", parallel: bool = True) -> Data:
    """Open ``spec`` (a ``--data`` value) for a run with ``global_batch`` examples per step
    over ``workers`` workers; ``eval_batch`` is the global batch of evaluation (default
    ``global_batch``). The other arguments are the flags of the same names."""
    kind = source_kind(spec)
    o = _Options(spec=spec, kind=kind, global_batch=global_batch, seed=seed, workers=workers,
                 eval_batch=eval_batch or global_batch, train_examples=train_examples,
                 validation_split=validation_split, image_size=image_size,
                 image_feature=image_feature, label_feature=label_feature, cache=cache,
                 input_shape=input_shape, num_classes=num_classes, model=model,
                 parallel=parallel)
    if kind == "mnist":
        data = _mnist(o, data_dir)
    elif kind == "npz":
        data = _arrays(o, read_npz(spec), source=str(Path(spec).resolve()))
    elif kind == "module":
        data = _module(o)
    elif kind == "folder":
        data = open_folder(o)
    elif kind == "tfrecord":
        data = _tfrecord(o)
    else:
        data = _synthetic(o)
    if data.train.steps_per_epoch < 1:
        raise DataError(f"--data {spec}: the global batch {global_batch} is larger than the "
                        f"{data.train_examples} training examples; lower --batch-size or "
                        "--global-batch-size")
    return data


@dataclass(frozen=True)
class _Options:
    spec: str
    kind: str
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

    def first(self, n: int) -> int:
        """How many training examples to keep of ``n`` (``--train-examples``)."""
        if self.train_examples is None:
            return n
        if self.train_examples > n:
            raise DataError(f"--train-examples {self.train_examples} is more than the {n} "
                            f"training examples of --data {self.spec}")
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
                raise DataError(f"--data {self.spec}: {split} label {y[low]} (example {low}) "
                                "is negative; labels are class indices 0, 1, ...")
            high = int(np.argmax(y))
            if self.num_classes is not None and y[high] >= self.num_classes:
                raise DataError(f"--data {self.spec}: {split} label {y[high]} (example {high}) "
                                f"is out of range for --num-classes {self.num_classes} (labels "
                                f"0-{self.num_classes - 1}); raise --num-classes or fix the "
                                "labels")
            top = max(top, int(y[high]))
        if self.num_classes is not None:
            return self.num_classes
        if top < 1:
            raise DataError(f"--data {self.spec}: every label is {max(top, 0)}; a classifier "
                            "needs at least 2 classes")
        return top + 1

    def holdout(self, n: int, has_val: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """(train, val) indices for --validation-split, or None without it."""
        if self.validation_split is None:
            return None
        if has_val:
            raise DataError(f"--data {self.spec} has its own validation split; drop "
                            "--validation-split")
        return holdout(n, self.validation_split, self.seed)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        if self.input_shape is not None and tuple(self.input_shape) != tuple(shape):
            raise DataError(f"--input-shape {','.join(map(str, self.input_shape))} is not the "
                            f"shape of --data {self.spec}'s examples "
                            f"({','.join(map(str, shape))})"
                            + ("; pass --image-size H,W to resize the images"
                               if self.kind in ("folder", "tfrecord") else "")
                            + " or drop --input-shape")


def _mnist(o: _Options, data_dir: str | None) -> Data:
    splits = load_mnist(data_dir, train_examples=o.train_examples)
    o.check_shape(splits.x_train.shape[1:])
    classes = o.classes({"train": splits.y_train, "val": splits.y_val, "test": splits.y_test})
    train = ShuffledBatches(x=splits.x_train, y=splits.y_train, global_batch=o.global_batch,
                            seed=o.seed)
    return Data(train=train, val=(splits.x_val, splits.y_val),
                test=(splits.x_test, splits.y_test), input_shape=splits.x_train.shape[1:],
                num_classes=classes, kind="mnist", source=splits.source,
                description=splits.source, fingerprint=train.order.fingerprint)


def _arrays(o: _Options, arrays: dict[str, tuple[np.ndarray, np.ndarray]], *, source: str,
            what: str = "") -> Data:
    """Data from (x, y) arrays per split (npz, or a function's arrays): in-memory order."""
    x, y = arrays["train"]
    val = arrays.get("val")
    split = o.holdout(len(x), val is not None)
    if split is not None:
        train_idx, val_idx = split
        val = (x[val_idx], y[val_idx])
        x, y = x[train_idx], y[train_idx]
    n = o.first(len(x))
    x, y = x[:n], y[:n].astype(np.int32)
    for name, pair in (("val", val), ("test", arrays.get("test"))):
        if pair is not None and pair[0].shape[1:] != x.shape[1:]:
            raise DataError(f"--data {o.spec}: x_{name} examples have shape "
                            f"{pair[0].shape[1:]}, x_train's {x.shape[1:]}; every split needs "
                            "the same shape")
    o.check_shape(x.shape[1:])
    present = {"train": y, **{k: v[1] for k, v in (("val", val), ("test", arrays.get("test")))
                              if v is not None}}
    classes = o.classes(present)
    val = None if val is None else (val[0], val[1].astype(np.int32))
    test = arrays.get("test")
    test = None if test is None else (test[0], test[1].astype(np.int32))
    train = ShuffledBatches(x=x, y=y, global_batch=o.global_batch, seed=o.seed)
    counts = ", ".join(f"{len(v[1]):,} {k}" for k, v in (("train", (x, y)), ("val", val),
                                                         ("test", test)) if v is not None)
    return Data(train=train, val=val, test=test, input_shape=tuple(x.shape[1:]),
                num_classes=classes, kind=o.kind, source=source,
                description=f"{what or source}: {counts} examples of shape "
                            f"{tuple(x.shape[1:])}, {classes} classes",
                fingerprint=train.order.fingerprint)


def _module(o: _Options) -> Data:
    splits = call_user_function(o.spec)
    if all(isinstance(s, tuple) or isinstance(s, list) for s in splits.values()):
        if o.cache:
            raise DataError(f"--data {o.spec} returned NumPy arrays, already in memory; drop "
                            "--cache")
        return _arrays(o, {k: tuple(v) for k, v in splits.items()}, source=o.spec,
                       what=f"{o.spec} (arrays)")
    train = splits["train"]
    if not isinstance(train, tf.data.Dataset):
        train = tf.data.Dataset.from_tensor_slices(tuple(train))
    labels = {"train": labels_of(train)}
    val = splits.get("val")
    split = o.holdout(len(labels["train"]), val is not None)
    if split is not None:
        mask = np.zeros(len(labels["train"]), bool)
        mask[split[1]] = True
        keep = tf.constant(mask)
        val = train.enumerate().filter(lambda i, _: keep[i]).map(lambda i, e: e)
        train = train.enumerate().filter(lambda i, _: ~keep[i]).map(lambda i, e: e)
        labels = {"train": labels["train"][~mask], "val": labels["train"][mask]}
    n = o.first(len(labels["train"]))
    labels["train"] = labels["train"][:n]
    evals = {}
    for name, part in (("val", val), ("test", splits.get("test"))):
        if part is None:
            continue
        if isinstance(part, tf.data.Dataset):
            labels.setdefault(name, labels_of(part))
            evals[name] = finish(part.batch(o.eval_batch))
        else:
            labels[name] = part[1]
            evals[name] = (part[0], part[1].astype(np.int32))
    classes = o.classes(labels)
    shape = tuple(train.element_spec[0].shape)
    o.check_shape(shape)
    fp = dataset_fingerprint(o.spec, train, n)
    batches = DatasetBatches(examples_ds=train.take(n), examples=n, global_batch=o.global_batch,
                             seed=o.seed, fingerprint=fp, cache=o.cache)
    return Data(train=batches, val=evals.get("val"), test=evals.get("test"), input_shape=shape,
                num_classes=classes, kind="module", source=o.spec, fingerprint=fp,
                description=f"{o.spec} (a dataset of {n:,} training examples of shape {shape}, "
                            f"{classes} classes" + (f", cached in {o.cache}" if o.cache else "")
                            + ")")


def _tfrecord(o: _Options) -> Data:
    files = tfrecord_files(o.spec) if any(c in o.spec for c in "*?[") else [o.spec]
    features = f"{o.image_feature}|{o.label_feature}"
    index = scan_records(files, o.image_feature, o.label_feature, o.spec,
                         files_fingerprint(files, extra=features))
    n_all = len(index.labels)
    train_mask = np.ones(n_all, bool)
    split = o.holdout(n_all, False)
    val_mask = None
    if split is not None:
        train_mask[split[1]] = False
        val_mask = ~train_mask
    kept = np.flatnonzero(train_mask)
    train_mask[kept[o.first(len(kept)):]] = False
    decoder = image_decoder(index.first_image, f"{files[0]} record 0", o.image_size, o.spec)
    o.check_shape(decoder.shape)
    labels = {"train": index.labels[train_mask]}
    if val_mask is not None:
        labels["val"] = index.labels[val_mask]
    classes = o.classes(labels)
    parse = parse_fn(o.image_feature, o.label_feature, decoder)

    def on_error(error):
        return decoding.explain(error, o.spec) or undecodable_records(
            index, o.image_feature, decoder, o.spec, error)

    mask = None if train_mask.all() else train_mask
    if o.cache is not None:  # decoded once, then read by index (the in-memory order)
        image_spec = {o.image_feature: tf.io.FixedLenFeature([], tf.string)}
        items = records_in_order(index, mask).map(
            lambda r, name: (tf.io.parse_single_example(r, image_spec)[o.image_feature], name))
        text = f"{index.fingerprint}|{decoder.shape}|{decoder.resize}|{o.validation_split}|cached"
        fingerprint = files_fingerprint([], extra=text)
        key = store_key(fingerprint, decoder, f"records|{int(train_mask.sum())}|{o.seed}")
        store = fill_store(items, int(train_mask.sum()), decoder, o.cache, key, on_error=on_error)
        batches = IndexedBatches(paths=np.array([], dtype=object), labels=labels["train"],
                                 decoder=decoder, global_batch=o.global_batch, seed=o.seed,
                                 fingerprint=fingerprint, store=store, parallel=o.parallel)
    else:
        batches = RecordBatches(index=index, decoder=decoder, image_feature=o.image_feature,
                                label_feature=o.label_feature, global_batch=o.global_batch,
                                seed=o.seed, workers=o.workers, train=mask, parallel=o.parallel)
    val = None if val_mask is None else eval_records(index, val_mask, parse, batch=o.eval_batch,
                                                     parallel=o.parallel)
    counts = f"{int(train_mask.sum()):,} train" + (
        f", {int(val_mask.sum()):,} val" if val_mask is not None else "")
    return Data(train=batches, val=val, test=None, input_shape=decoder.shape,
                num_classes=classes, kind="tfrecord", source=o.spec,
                fingerprint=batches.order.fingerprint, _explain=decode_errors(on_error),
                description=f"{len(files)} TFRecord file(s) {o.spec} ({counts} records, "
                            f"{classes} classes, decoded to {'x'.join(map(str, decoder.shape))}"
                            + (f", cached in {o.cache}" if o.cache else ", streamed") + ")")


def _synthetic(o: _Options) -> Data:
    from mirrorfit.data.synthetic import synthetic_batches
    from mirrorfit.models.names import IMAGENET_CLASSES, default_input_shape, is_application

    application = is_application(o.model)
    shape = tuple(o.input_shape) if o.input_shape is not None else (
        default_input_shape(o.model) if application else (28, 28))
    classes = o.num_classes or (IMAGENET_CLASSES if application else 10)
    examples = o.train_examples or SYNTHETIC_STEPS * o.global_batch
    train = synthetic_batches(input_shape=shape, num_classes=classes,
                              global_batch=o.global_batch,
                              steps_per_epoch=max(1, examples // o.global_batch), seed=o.seed)
    return Data(train=train, val=None, test=None, input_shape=shape, num_classes=classes,
                kind="synthetic", source="synthetic", fingerprint=train.order.fingerprint,
                description=f"synthetic data ({train.steps_per_epoch} steps per epoch of random "
                            f"examples of shape {shape}, {classes} classes; no validation or "
                            "test: nothing is learnt from it)")


__all__ = ["Data", "load_data"]
