"""Training data read by index, one example each, from image files or from a store of decoded
examples (``--cache memory|DIR``, a ``.npy`` file in DIR reused by later runs). The order and
resume are those of in-memory arrays (:mod:`mirrorfit.data.pipeline`), split across workers at
file level; files are decoded in parallel in a deterministic order.
(docs/data.md; why not tf.data's ``cache()``: docs/architecture.md#data-sources)
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import tensorflow as tf

from mirrorfit import _io
from mirrorfit.data.decode import ImageDecoder, find_undecodable
from mirrorfit.data.pipeline import DataOrder, finish, index_rows, shuffle
from mirrorfit.errors import DataError

FILL_BATCH = 256  # images decoded per write while filling a cache


@dataclass(frozen=True, eq=False)
class IndexedBatches:
    """Training batches of examples read by index: from ``paths`` (encoded image files, decoded by
    ``decoder``) or ``store`` (decoded uint8 pixels [examples, height, width, channels], an array
    or a read-only memory map); ``labels``: int32 per example. ``fingerprint`` (the files' names,
    sizes, mtimes; not the cache) refuses a resume on changed files.
    """

    paths: np.ndarray
    labels: np.ndarray
    decoder: ImageDecoder
    global_batch: int
    seed: int
    fingerprint: str
    store: np.ndarray | None = None
    parallel: bool = True

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps (global batches) per epoch; the remainder is dropped."""
        return len(self.labels) // self.global_batch

    @cached_property
    def order(self) -> DataOrder:
        return DataOrder(
            seed=self.seed,
            examples=len(self.labels),
            global_batch=self.global_batch,
            fingerprint=self.fingerprint,
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
        first ``skip`` batches left out; each element worker ``worker``'s contiguous share
        (``global_batch // workers`` examples) of a global batch: (pixels, labels)."""
        rows = index_rows(
            len(self.labels),
            self.global_batch,
            seed=self.seed,
            start_epoch=start_epoch,
            epochs=epochs,
            skip=skip,
            worker=worker,
            workers=workers,
        )
        share = self.global_batch // workers
        return finish(self._read(rows, share))

    def _read(self, rows: tf.data.Dataset, share: int) -> tf.data.Dataset:
        labels = tf.constant(self.labels)
        calls = tf.data.AUTOTUNE if self.parallel else None
        if self.store is not None:
            read = store_reader(self.store)
            return rows.map(
                lambda i: (read(i), tf.gather(labels, i)),
                num_parallel_calls=calls,
                deterministic=True,
            )
        paths = tf.constant(self.paths.astype(str))

        def one(i):
            path = paths[i]
            return self.decoder(tf.io.read_file(path), path), labels[i]

        # Unbatched, so that the decoding of one batch runs on every core.
        ds = rows.unbatch().map(one, num_parallel_calls=calls, deterministic=True)
        return ds.batch(share, drop_remainder=True)

    def sampled(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        """For parameter-server workers: an endless stream of global batches, reshuffled each
        pass with the run's seed and the worker's index; pure TensorFlow (it runs on the
        worker). Decodes the files; decoded TFRecords (no files to read by index) are sent
        to the workers whole, a memory map loaded first."""
        seed = tf.cast(context.input_pipeline_id, tf.int64) + self.seed * 1000
        if not len(self.paths):
            ds = tf.data.Dataset.from_tensor_slices((np.asarray(self.store), self.labels))
            ds = shuffle(ds, len(self.labels), seed=seed, reshuffle_each_iteration=True).repeat()
            return finish(ds.batch(self.global_batch, drop_remainder=True))
        ds = tf.data.Dataset.from_tensor_slices((self.paths.astype(str), self.labels))
        ds = shuffle(ds, len(self.labels), seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.map(
            lambda p, y: (self.decoder(tf.io.read_file(p), p), y),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        return finish(ds.batch(self.global_batch, drop_remainder=True))


def indexed_batches(
    o, paths: np.ndarray, labels: np.ndarray, decoder: ImageDecoder, fingerprint: str, store
) -> IndexedBatches:
    """:class:`IndexedBatches` with the run's global batch, seed and parallelism; ``o``:
    :class:`mirrorfit.data.arrays.Options`, ``store``: as the class's (None: decode ``paths``)."""
    return IndexedBatches(
        paths=paths,
        labels=labels,
        decoder=decoder,
        global_batch=o.global_batch,
        seed=o.seed,
        fingerprint=fingerprint,
        store=store,
        parallel=o.parallel,
    )


def store_reader(store: np.ndarray):
    """A function from example indices to rows of a decoded store: a gather from one constant
    for an array in memory, a NumPy call for a memory map (read from disk through the page
    cache, never all of it in memory)."""
    if isinstance(store, np.memmap):

        def read(index):
            out = tf.numpy_function(
                lambda i: np.asarray(store[i]), [index], tf.uint8, stateful=False
            )
            return tf.ensure_shape(out, [None, *store.shape[1:]])

        return read
    pixels = tf.constant(store)
    return lambda index: tf.gather(pixels, index)


def eval_files(
    paths: np.ndarray,
    labels: np.ndarray,
    decoder: ImageDecoder,
    *,
    batch: int,
    store: np.ndarray | None = None,
    parallel: bool = True,
    raw: bool = False,
) -> tf.data.Dataset:
    """Every example once, in order, as a dataset of global batches (the last one partial),
    decoded in parallel, or read from a decoded ``store``; ``raw``: uint8 pixels as decoded,
    not scaled to [0, 1]."""
    calls = tf.data.AUTOTUNE if parallel else None
    if store is not None:
        rows = tf.data.Dataset.range(len(labels)).batch(batch)
        y, read = tf.constant(labels), store_reader(store)
        ds = rows.map(
            lambda i: (read(i), tf.gather(y, i)), num_parallel_calls=calls, deterministic=True
        )
        return finish(ds, scaled=raw)
    ds = tf.data.Dataset.from_tensor_slices((paths.astype(str), labels))
    ds = ds.map(
        lambda p, y: (decoder(tf.io.read_file(p), p), y),
        num_parallel_calls=calls,
        deterministic=True,
    )
    return finish(ds.batch(batch), scaled=raw)


def undecodable_files(
    paths: np.ndarray, decoder: ImageDecoder, flag: str, cause: tf.errors.OpError
) -> DataError:
    """Name the files of ``paths`` that do not decode (one parallel pass over them)."""
    names = [str(p) for p in paths]
    items = tf.data.Dataset.from_tensor_slices(
        (np.arange(len(names), dtype=np.int64), np.array(names, dtype=str))
    )
    items = items.map(lambda i, p: (i, tf.io.read_file(p)))
    return find_undecodable(items, names, flag, cause)


def fill_store(
    items: tf.data.Dataset, count: int, decoder: ImageDecoder, cache: str, key: str, *, on_error
) -> np.ndarray:
    """Decode ``items`` (``count`` of ``(raw bytes, name)`` in the source's order) once into a
    store: an array for ``cache == "memory"``, else a ``.npy`` file in folder ``cache`` named by
    ``key``, reused when it exists, written aside and renamed when complete. ``on_error(OpError) ->
    DataError`` names a file that does not decode.
    """
    shape = (count, *decoder.shape)
    if cache == "memory":
        _check_fits_in_memory(int(np.prod(shape, dtype=np.int64)))
        store = np.empty(shape, np.uint8)
        _decode_into(store, items, decoder, on_error)
        return store
    folder = Path(cache)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # os.access said yes (root), the file system says no
        raise DataError(
            f"--cache {cache} cannot be made ({e.strerror or type(e).__name__}); give a "
            "folder this process can write, or --cache memory"
        ) from None
    final = folder / f"mirrorfit-cache-{key}.npy"
    sums = final.with_name(final.name + ".crc32")  # of the whole file, written with it
    if final.is_file():
        try:
            store = np.load(final, mmap_mode="r")
            if store.shape == shape and store.dtype == np.uint8 and _intact(final, sums, cache):
                return store
        except (OSError, ValueError):
            pass  # damaged or foreign: written again below
    tmp = folder / f".{final.name}.tmp-{_io.temp_tag()}"
    size = int(np.prod(shape, dtype=np.int64))
    try:
        with _io.disk_full_hint(
            f"--cache {cache} ({size / 2**30:.2f} GiB of decoded images)", "nothing was cached"
        ):
            store = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
            _decode_into(store, items, decoder, on_error)
            store.flush()
            del store
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            crc = _io.file_crc(tmp)
            os.replace(tmp, final)
            try:
                _io.write_bytes_atomic(sums, str(crc).encode())
            except OSError as e:  # a folder in its place: the next run decodes again
                raise DataError(
                    f"--cache {cache}: cannot write {sums} ({e.strerror or type(e).__name__}); "
                    "remove what is there, or give another --cache folder"
                ) from None
        _io.fsync_dir(folder)
    finally:
        if tmp.exists():
            tmp.unlink()
    return np.load(final, mmap_mode="r")


def _intact(store: Path, sums: Path, cache: str) -> bool:
    """Whether ``store`` matches the CRC written beside it; a warning where it does not (or
    has none: an earlier mirrorfit's, or cut off before it): it is decoded again."""
    try:
        intact = int(sums.read_text()) == _io.file_crc(store)
    except (OSError, ValueError):
        intact = False
    if not intact:
        warnings.warn(
            f"--cache {cache}: {store.name} does not match its checksum (or has none); "
            "decoding the images into it again",
            stacklevel=2,
        )
    return intact


def _check_fits_in_memory(size: int) -> None:
    """DataError, before any image is decoded, when ``size`` bytes of decoded images would
    take more than 3/4 of the memory available now."""
    import psutil

    available = psutil.virtual_memory().available
    if size > 0.75 * available:
        raise DataError(
            f"the decoded images take {size / 2**30:.2f} GiB, more than this machine's "
            f"memory can hold ({available / 2**30:.2f} GiB available); give --cache FOLDER "
            "to decode them once into a file there, read through a memory map"
        )


def _decode_into(
    store: np.ndarray, items: tf.data.Dataset, decoder: ImageDecoder, on_error
) -> None:
    ds = items.map(decoder, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(FILL_BATCH).prefetch(2)
    at = 0
    try:
        for batch in ds.as_numpy_iterator():
            store[at : at + len(batch)] = batch
            at += len(batch)
    except tf.errors.OpError as e:
        raise on_error(e) from None


def store_key(fingerprint: str, decoder: ImageDecoder, what: str) -> str:
    """The name of a cache file: the same files decoded to the same shape, and nothing else."""
    text = f"{what}|{fingerprint}|{decoder.shape}|{decoder.resize}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


__all__ = [
    "IndexedBatches",
    "eval_files",
    "fill_store",
    "indexed_batches",
    "store_reader",
    "store_key",
    "undecodable_files",
]
