"""TFRecord files of ``tf.train.Example``: an encoded image and an int64 label under
configurable feature names, streamed from disk.

- :func:`scan_records`: every file read once at start, no image decoded: records counted,
  features, labels and framing checked (naming file, record and byte offset);
- :class:`RecordBatches`: epoch e permutes the files with (seed, e); worker w of W reads its
  contiguous part of the records, ``CYCLE`` files at a time, through a ``SHUFFLE_BUFFER``
  seeded with (seed, e, w). The order depends on W, so a resume needs the same W.

(docs/data.md; details: docs/architecture.md#data-sources)
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from functools import cached_property, partial

import numpy as np
import tensorflow as tf

from mirrorfit.data.decode import ImageDecoder, find_undecodable
from mirrorfit.data.files import files_fingerprint
from mirrorfit.data.folders import decode_errors, describe_decoded, on_decode_error, train_decoder
from mirrorfit.data.images import IndexedBatches, fill_store, indexed_batches, store_key
from mirrorfit.data.opened import Data
from mirrorfit.data.pipeline import DataOrder, epoch_order, finish, shuffle
from mirrorfit.data.spec import tfrecord_files
from mirrorfit.errors import DataError

CYCLE = 4  # files read at once per worker (interleaved)
SHUFFLE_BUFFER = 4096  # records shuffled per worker (encoded: ~1 KB each for MNIST PNGs)
SCAN_BATCH = 1024


@dataclass(frozen=True)
class RecordIndex:
    """What the scan found: files (sorted), records per file, every record's label (int32, in
    file order), the first record's image bytes (for the shape), and a fingerprint of the
    files' names, sizes and modification times and the feature names."""

    files: tuple[str, ...]
    counts: np.ndarray
    labels: np.ndarray
    first_image: bytes
    fingerprint: str

    @property
    def offsets(self) -> np.ndarray:
        """Index of each file's first record among all records."""
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)


def scan_records(
    files: list[str], image_feature: str, label_feature: str, flag: str, fingerprint: str
) -> RecordIndex:
    """Read every record of ``files`` once (labels parsed, images not decoded); DataError
    naming the file and record for a damaged file, a missing or repeated feature, a label of
    another type, or a negative label."""
    spec = {
        image_feature: tf.io.VarLenFeature(tf.string),
        label_feature: tf.io.VarLenFeature(tf.int64),
    }
    counts, labels, first = [], [], None
    for path in files:
        _check_framing(path, flag)  # before TensorFlow allocates what a header claims
        n = 0
        try:
            for batch in tf.data.TFRecordDataset(path).batch(SCAN_BATCH):
                parsed = tf.io.parse_example(batch, spec)
                image, label = parsed[image_feature], parsed[label_feature]
                rows = int(tf.shape(batch)[0])
                for feature, values in ((image_feature, image), (label_feature, label)):
                    per_row = tf.math.bincount(
                        tf.cast(values.indices[:, 0], tf.int32), minlength=rows, maxlength=rows
                    ).numpy()
                    bad = np.flatnonzero(per_row != 1)
                    if len(bad):
                        raise _feature_error(
                            path,
                            n + int(bad[0]),
                            feature,
                            int(per_row[bad[0]]),
                            batch[int(bad[0])].numpy(),
                            flag,
                        )
                if first is None and rows:
                    first = image.values[0].numpy()
                values = label.values.numpy()
                if values.min(initial=0) < 0 or values.max(initial=0) > np.iinfo(np.int32).max:
                    i = int(np.flatnonzero((values < 0) | (values > np.iinfo(np.int32).max))[0])
                    raise DataError(
                        f"--data {flag}: {path} record {n + i} has label "
                        f"{values[i]} under {label_feature}; labels are class "
                        "indices 0, 1, ... (fix the file)"
                    )
                labels.append(values.astype(np.int32))
                n += rows
        except tf.errors.DataLossError as e:  # a bad checksum, or cut inside a record
            raise _damaged(path, str(getattr(e, "message", e)), flag) from None
        except tf.errors.OpError as e:  # a record that is not an Example, types
            reason = str(getattr(e, "message", e)).strip().splitlines()[0][:200]
            raise DataError(
                f"--data {flag}: cannot read {path} near record {n} ({reason}); "
                "is it a TFRecord file of tf.train.Example with "
                f"--image-feature {image_feature} and --label-feature "
                f"{label_feature}?"
            ) from None
        counts.append(n)
    if first is None:
        raise DataError(f"--data {flag}: the {len(files)} file(s) hold no record")
    return RecordIndex(
        files=tuple(files),
        counts=np.array(counts, np.int64),
        labels=np.concatenate(labels),
        first_image=first,
        fingerprint=fingerprint,
    )


def _damaged(path: str, reason: str, flag: str) -> DataError:
    """One line naming the file, the byte offset and the record of a damaged record, from
    TensorFlow's "corrupted record at N" / "truncated record at N" (N: the record's start)."""
    found = re.search(r"(corrupted|truncated) record at (\d+)", reason)
    if found is None:
        return DataError(
            f"--data {flag}: {path} is damaged ({reason.splitlines()[0][:200]}); "
            "copy it again or rewrite it"
        )
    record, at = _record_at(path, int(found.group(2)))
    what = "truncated" if found.group(1) == "truncated" else "a checksum does not match its bytes"
    return DataError(
        f"--data {flag}: {path} is damaged at byte offset {at} (record {record}; "
        f"{what}); copy it again or rewrite it"
    )


def _check_framing(path: str, flag: str) -> None:
    """Walk the records' 12-byte headers: DataError if the file is GZIP-compressed, a header is cut
    short, or a header gives a length past the end of the file.
    (why: docs/architecture.md#data-sources)
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb", buffering=1 << 20) as f:
            if f.read(2) == b"\x1f\x8b":
                raise DataError(
                    f"--data {flag}: {path} is GZIP-compressed; mirrorfit reads "
                    "uncompressed TFRecord files: gunzip it"
                )
            at, index = 0, 0
            while at < size:
                f.seek(at)
                header = f.read(8)
                length = int.from_bytes(header, "little")
                if len(header) < 8 or at + 16 + length > size:
                    left = size - at - 12  # after the header
                    what = (
                        "truncated: a record header cut short"
                        if len(header) < 8 or left < 0
                        else f"truncated: its header gives {length} bytes, {left} are left"
                    )
                    raise DataError(
                        f"--data {flag}: {path} is damaged at byte offset {at} "
                        f"(record {index}; {what}); copy it again or rewrite it"
                    )
                at, index = at + 16 + length, index + 1
    except OSError as e:
        raise DataError(
            f"--data {flag}: cannot read {path} ({e.strerror}); check the file and its permissions"
        ) from None


def _record_at(path: str, offset: int) -> tuple[int, int]:
    """(index, start) of the record that holds byte ``offset``, by walking the records'
    lengths (TensorFlow names a bad checksum by the offset of the record's bytes)."""
    index, at = 0, 0
    with open(path, "rb") as f:
        while True:
            f.seek(at)
            header = f.read(8)
            end = at + 16 + int.from_bytes(header, "little")
            if len(header) < 8 or end > offset:
                return index, at
            at, index = end, index + 1


def _feature_error(
    path: str, record: int, feature: str, found: int, raw: bytes, flag: str
) -> DataError:
    if found:
        return DataError(
            f"--data {flag}: {path} record {record} has {found} values under "
            f"{feature}; one image and one label per record are needed"
        )
    present = sorted(tf.train.Example.FromString(raw).features.feature)
    return DataError(
        f"--data {flag}: {path} record {record} has no feature {feature!r} (it has "
        f"{', '.join(present) or 'none'}); name the features with --image-feature "
        "and --label-feature"
    )


def parse_fn(image_feature: str, label_feature: str, decoder: ImageDecoder):
    """(serialized Example, name) -> (uint8 pixels, int32 label)."""
    spec = {
        image_feature: tf.io.FixedLenFeature([], tf.string),
        label_feature: tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(serialized, name):
        example = tf.io.parse_single_example(serialized, spec)
        return (decoder(example[image_feature], name), tf.cast(example[label_feature], tf.int32))

    return parse


@dataclass(frozen=True, eq=False)
class RecordBatches:
    """Streamed training batches from TFRecord files (see the module's docstring for what
    holds). ``train``: per record (in file order) whether it is a training record (False:
    held out by ``--validation-split``); None: all are. ``workers``: the W the order is for."""

    index: RecordIndex
    decoder: ImageDecoder
    image_feature: str
    label_feature: str
    global_batch: int
    seed: int
    workers: int = 1
    train: np.ndarray | None = None
    parallel: bool = True

    @cached_property
    def counts(self) -> np.ndarray:
        """Training records per file."""
        if self.train is None:
            return self.index.counts
        file_of = np.repeat(np.arange(len(self.index.files)), self.index.counts)
        return np.bincount(file_of[self.train], minlength=len(self.index.files)).astype(np.int64)

    @property
    def examples(self) -> int:
        return int(self.counts.sum())

    @property
    def steps_per_epoch(self) -> int:
        return self.examples // self.global_batch

    @cached_property
    def order(self) -> DataOrder:
        # The split over workers changes the order: W is part of what the data is.
        text = f"{self.index.fingerprint}|records|workers={self.workers}"
        return DataOrder(
            seed=self.seed,
            examples=self.examples,
            global_batch=self.global_batch,
            fingerprint=hashlib.blake2b(text.encode(), digest_size=8).hexdigest(),
        )

    def epoch_slices(self, epoch: int, worker: int, workers: int) -> np.ndarray:
        """Worker ``worker``'s reading list for ``epoch``: rows (file index, first training
        record of it to read, how many), in the epoch's file order (int64, [k, 3])."""
        share = self.steps_per_epoch * (self.global_batch // workers)
        lo, hi = worker * share, (worker + 1) * share
        perm = epoch_order(len(self.index.files), seed=self.seed, epoch=epoch)
        ends = np.cumsum(self.counts[perm])
        starts = ends - self.counts[perm]
        rows = [
            (f, max(lo - s, 0), min(hi, e) - max(lo, s))
            for f, s, e in zip(perm, starts, ends)
            if s < hi and e > lo
        ]
        return np.array(rows, np.int64).reshape(-1, 3)

    def _records(self, slices: tf.data.Dataset) -> tf.data.Dataset:
        """(serialized, name) of the training records that ``slices`` rows name, CYCLE files
        interleaved, in a deterministic order."""
        files = tf.constant(list(self.index.files))
        offsets = tf.constant(self.index.offsets)
        keep = tf.constant(self.train if self.train is not None else np.zeros(0, bool))

        def read(row):
            f, first, count = row[0], row[1], row[2]
            ds = tf.data.TFRecordDataset(files[f]).enumerate()
            if self.train is not None:
                ds = ds.filter(lambda i, _: keep[offsets[f] + i])
            ds = ds.skip(first).take(count)
            return ds.map(
                lambda i, r: (r, tf.strings.join([files[f], " record ", tf.strings.as_string(i)]))
            )

        return slices.interleave(
            read,
            cycle_length=CYCLE,
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )

    def dataset(
        self,
        *,
        start_epoch: int = 0,
        epochs: int = 1,
        skip: int = 0,
        worker: int = 0,
        workers: int = 1,
    ) -> tf.data.Dataset:
        """The trainer's protocol: epochs ``start_epoch``..``epochs - 1`` back to back, the
        first ``skip`` batches left out (their records read, not decoded); each element this
        worker's share of a global batch, from its own files. (``workers`` other than the
        ``workers`` the batches were made for gives another order than the fingerprint says:
        the trainer asks for (0, 1) only to read the element spec.)"""
        if not 0 <= skip <= self.steps_per_epoch:
            raise ValueError(f"skip {skip} is outside an epoch of {self.steps_per_epoch} steps")
        share = self.global_batch // workers
        per_worker = self.steps_per_epoch * share
        buffer = max(1, min(SHUFFLE_BUFFER, per_worker))

        def epoch_records(epoch):
            rows = tf.numpy_function(
                lambda e: self.epoch_slices(int(e), worker, workers),
                [epoch],
                tf.int64,
                stateful=False,
            )
            rows.set_shape([None, 3])
            seed = (self.seed * 1_000_003 + epoch) * 1009 + worker
            ds = self._records(tf.data.Dataset.from_tensor_slices(rows))
            return shuffle(ds, buffer, seed=seed, reshuffle_each_iteration=False)

        ds = tf.data.Dataset.range(start_epoch, epochs).flat_map(epoch_records)
        ds = ds.skip(skip * share)  # before decoding: a resume reads but does not decode them
        calls = tf.data.AUTOTUNE if self.parallel else None
        ds = ds.map(
            parse_fn(self.image_feature, self.label_feature, self.decoder),
            num_parallel_calls=calls,
            deterministic=True,
        )
        return finish(ds.batch(share, drop_remainder=True))

    def sampled(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        """For parameter-server workers: an endless stream of global batches, each pass over
        the files in another order (seeded with the run's seed and the worker's index); pure
        TensorFlow."""
        seed = tf.cast(context.input_pipeline_id, tf.int64) + self.seed * 1000
        n = len(self.index.files)
        rows = np.stack([np.arange(n), np.zeros(n, np.int64), self.counts], 1).astype(np.int64)
        rows = tf.data.Dataset.from_tensor_slices(rows[self.counts > 0])
        rows = shuffle(rows, n, seed=seed, reshuffle_each_iteration=True).repeat()
        ds = shuffle(self._records(rows), SHUFFLE_BUFFER, seed=seed)
        ds = ds.map(
            parse_fn(self.image_feature, self.label_feature, self.decoder),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        return finish(ds.batch(self.global_batch, drop_remainder=True))


def records_in_order(index: RecordIndex, want: np.ndarray | None) -> tf.data.Dataset:
    """(serialized, name) of the records whose entry in ``want`` is True (all if None), file
    after file in the sorted order."""
    files = tf.constant(list(index.files))
    offsets = tf.constant(index.offsets)
    keep = tf.constant(want if want is not None else np.zeros(0, bool))

    def read(f):
        ds = tf.data.TFRecordDataset(files[f]).enumerate()
        if want is not None:
            ds = ds.filter(lambda i, _: keep[offsets[f] + i])
        return ds.map(
            lambda i, r: (r, tf.strings.join([files[f], " record ", tf.strings.as_string(i)]))
        )

    # One file after the other: the order (and enumerate's count) is the records' names'.
    return tf.data.Dataset.range(len(index.files)).flat_map(read)


def eval_records(
    index: RecordIndex,
    want: np.ndarray | None,
    parse,
    *,
    batch: int,
    parallel: bool = True,
    raw: bool = False,
) -> tf.data.Dataset:
    """Every wanted record once, in file order, as a dataset of global batches (the last one
    partial), decoded in parallel; ``raw``: uint8 pixels as decoded, not scaled to [0, 1]."""
    calls = tf.data.AUTOTUNE if parallel else None
    ds = records_in_order(index, want).map(parse, num_parallel_calls=calls, deterministic=True)
    return finish(ds.batch(batch), scaled=raw)


def undecodable_records(
    index: RecordIndex,
    image_feature: str,
    decoder: ImageDecoder,
    flag: str,
    cause: tf.errors.OpError,
) -> DataError:
    """Name the records whose image does not decode (one parallel pass over all of them)."""
    names = [f"{path} record {i}" for path, n in zip(index.files, index.counts) for i in range(n)]
    spec = {image_feature: tf.io.FixedLenFeature([], tf.string)}
    items = (
        records_in_order(index, None)
        .enumerate()
        .map(lambda i, item: (i, tf.io.parse_single_example(item[0], spec)[image_feature]))
    )
    return find_undecodable(items, names, flag, cause)


__all__ = [
    "RecordBatches",
    "RecordIndex",
    "scan_records",
    "parse_fn",
    "records_in_order",
    "eval_records",
    "undecodable_records",
    "CYCLE",
    "SHUFFLE_BUFFER",
]


def open_train(o) -> Data:
    """TFRecord files for training, streamed (or decoded once with --cache); ``o``:
    :class:`mirrorfit.data.arrays.Options`."""
    index = _scan(o)
    train_mask, val_mask = _split_masks(len(index.labels), o)
    decoder = train_decoder(o, index.first_image, f"{index.files[0]} record 0")
    splits = (("train", train_mask), ("val", val_mask))
    labels = {k: index.labels[m] for k, m in splits if m is not None}
    classes = o.classes(labels)
    find = partial(undecodable_records, index, o.image_feature, decoder, o.spec)
    on_error = on_decode_error(o.spec, find)
    mask = None if train_mask.all() else train_mask  # None: no record is filtered out
    if o.cache is not None:
        batches = _cached_batches(o, index, mask, labels["train"], decoder, on_error)
    else:
        batches = _streamed_batches(o, index, mask, decoder)
    return Data(
        train=batches,
        val=_held_out(o, index, val_mask, decoder),
        test=None,
        input_shape=decoder.shape,
        num_classes=classes,
        kind="tfrecord",
        source=o.spec,
        fingerprint=batches.order.fingerprint,
        _explain=decode_errors(on_error),
        description=describe_decoded(
            f"{len(index.files)} TFRecord file(s) {o.spec}",
            {k: len(y) for k, y in labels.items()},
            "records",
            classes,
            decoder,
            o.cache,
            ", streamed",
        ),
    )


def _scan(o) -> RecordIndex:
    """:func:`scan_records` of the file --data names, or of every match of its glob (sorted)."""
    files = tfrecord_files(o.spec) if any(c in o.spec for c in "*?[") else [o.spec]
    features = f"{o.image_feature}|{o.label_feature}"
    return scan_records(
        files, o.image_feature, o.label_feature, o.spec, files_fingerprint(files, extra=features)
    )


def _split_masks(n: int, o) -> tuple[np.ndarray, np.ndarray | None]:
    """(train, val) bool masks over the ``n`` records, val None without --validation-split."""
    train = np.ones(n, bool)
    split = o.holdout(n, False)
    val = None
    if split is not None:
        train[split[1]] = False
        val = ~train
    # --train-examples: the first of the records left for training, in file order.
    kept = np.flatnonzero(train)
    train[kept[o.first(len(kept)) :]] = False
    return train, val


def _cached_batches(
    o,
    index: RecordIndex,
    mask: np.ndarray | None,
    labels: np.ndarray,
    decoder: ImageDecoder,
    on_error,
) -> IndexedBatches:
    """The training records (``mask``: None for all; ``labels``: theirs) decoded once into
    --cache, then read by index (the in-memory order)."""
    image_spec = {o.image_feature: tf.io.FixedLenFeature([], tf.string)}
    items = records_in_order(index, mask).map(
        lambda r, name: (tf.io.parse_single_example(r, image_spec)[o.image_feature], name)
    )
    text = f"{index.fingerprint}|{decoder.shape}|{decoder.resize}|{o.validation_split}|cached"
    fingerprint = files_fingerprint([], extra=text)
    key = store_key(fingerprint, decoder, f"records|{len(labels)}|{o.seed}")
    store = fill_store(items, len(labels), decoder, o.cache, key, on_error=on_error)
    return indexed_batches(o, np.array([], dtype=object), labels, decoder, fingerprint, store)


def _streamed_batches(
    o, index: RecordIndex, mask: np.ndarray | None, decoder: ImageDecoder
) -> RecordBatches:
    """The training records (``mask``: None for all) streamed from the files."""
    return RecordBatches(
        index=index,
        decoder=decoder,
        image_feature=o.image_feature,
        label_feature=o.label_feature,
        global_batch=o.global_batch,
        seed=o.seed,
        workers=o.workers,
        train=mask,
        parallel=o.parallel,
    )


def _held_out(
    o, index: RecordIndex, val_mask: np.ndarray | None, decoder: ImageDecoder
) -> tf.data.Dataset | None:
    """The --validation-split records (None without it) as batches of ``o.eval_batch``."""
    if val_mask is None:
        return None
    parse = parse_fn(o.image_feature, o.label_feature, decoder)
    return eval_records(index, val_mask, parse, batch=o.eval_batch, parallel=o.parallel, raw=o.raw)
