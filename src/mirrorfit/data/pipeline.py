"""tf.data pipelines that keep the replicas fed. The training order depends only on (seed,
epoch) and the global batch, never on the replica count; all epochs of a run come from one
dataset, so one distributed iterator. (why: docs/architecture.md#data-sources)
"""

from __future__ import annotations

import hashlib
import numbers
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from mirrorfit.data._tf import tf
from mirrorfit.errors import FitError


def epoch_order(num_examples: int, *, seed: int, epoch: int) -> np.ndarray:
    """The permutation of example indices for ``epoch``: seeded, replica-independent."""
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


@dataclass(frozen=True)
class DataOrder:
    """What fixes the examples each optimizer step sees. A checkpoint stores it: a resume with
    another value would repeat or skip examples, so it is refused rather than silently wrong."""

    seed: int
    examples: int  # training examples (each epoch a permutation of them)
    global_batch: int  # examples per optimizer step: the unit of the position (epoch, step)
    fingerprint: str | None = None  # of the examples themselves: another file, same count


def fingerprint(*arrays: np.ndarray) -> str:
    """A short hash of the training arrays (shapes, dtypes, bytes): ~0.1 s for MNIST's 47 MB,
    once per run, against resuming on other data without a word."""
    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


def check_lengths(x, y, where: str) -> None:
    """FitError (a ValueError) unless ``x`` and ``y`` hold as many examples (a shorter one
    would be cut, or fail in a reading thread)."""
    nx, ny = len(x), len(y)
    if nx != ny:
        raise FitError(
            f"{where}: x has {nx} examples and y has {ny}; give as many labels as inputs"
        )


@dataclass(frozen=True, eq=False)
class ShuffledBatches:
    """Training data: each epoch a seeded permutation of (x, y), cut into full global batches
    (the remainder is dropped). Build with :func:`train_batches`."""

    x: np.ndarray
    y: np.ndarray
    global_batch: int
    seed: int

    def __post_init__(self) -> None:
        check_lengths(self.x, self.y, "train_batches")
        batch = self.global_batch
        if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
            raise FitError(
                f"train_batches: global_batch {self.global_batch!r} must be a positive integer"
            )
        object.__setattr__(self, "global_batch", int(batch))  # NumPy's ints: not JSON

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps (global batches) per epoch."""
        return len(self.x) // self.global_batch

    @cached_property  # the fingerprint reads every byte: once
    def order(self) -> DataOrder:
        return DataOrder(
            seed=self.seed,
            examples=len(self.x),
            global_batch=self.global_batch,
            fingerprint=fingerprint(self.x, self.y),
        )

    def epoch_batches(self, epoch: int, worker: int = 0, workers: int = 1) -> np.ndarray:
        """Example indices of ``epoch``, one row per global batch (int64, [steps, batch]);
        with ``workers`` > 1, worker ``worker``'s contiguous share of each row."""
        return epoch_rows(
            len(self.x),
            self.global_batch,
            seed=self.seed,
            epoch=epoch,
            worker=worker,
            workers=workers,
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
        """Batches of epochs ``start_epoch``..``epochs - 1`` back to back, the first ``skip``
        batches left out (they were trained on before a resume). With ``workers`` > 1, each
        batch is worker ``worker``'s contiguous share of the global batch: the same examples
        in the same order whatever the number of workers."""
        # Only indices are shuffled (NumPy, cheap); images are gathered per batch (each worker
        # gathers only its share).
        ds = index_rows(
            len(self.x),
            self.global_batch,
            seed=self.seed,
            start_epoch=start_epoch,
            epochs=epochs,
            skip=skip,
            worker=worker,
            workers=workers,
        )
        x, y = tf.constant(self.x), tf.constant(self.y)
        # Gathered and scaled in one map: two parallel maps cost the MLP ~5% of its steps here
        # (each hands every batch to another thread).
        ds = ds.map(
            lambda i: _to_float(tf.gather(x, i), tf.gather(y, i)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        return finish(ds, scaled=True)

    def sampled(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        """For parameter-server workers: this worker's endless stream of global batches,
        reshuffled each pass with the run's seed and the worker's index
        (``context.input_pipeline_id``, a tensor known on the worker). Pure TensorFlow, no
        NumPy callback: it runs on the worker, where the chief's Python does not. Every
        worker samples all examples; an epoch is a count of steps, not a visit of each."""
        seed = tf.cast(context.input_pipeline_id, tf.int64) + self.seed * 1000
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.y))
        ds = shuffle(ds, len(self.x), seed=seed, reshuffle_each_iteration=True).repeat()
        return finish(ds.batch(self.global_batch, drop_remainder=True))


def epoch_rows(
    num_examples: int,
    global_batch: int,
    *,
    seed: int,
    epoch: int,
    worker: int = 0,
    workers: int = 1,
) -> np.ndarray:
    """Example indices of ``epoch`` (int64, [steps, global_batch // workers]): one row per
    global batch of the seeded permutation (the remainder dropped), worker ``worker``'s
    contiguous share of each. Over all workers every row is the same whatever their number."""
    steps = num_examples // global_batch
    order = epoch_order(num_examples, seed=seed, epoch=epoch)
    rows = order[: steps * global_batch].reshape(steps, global_batch).astype(np.int64)
    share = global_batch // workers
    return rows[:, worker * share : (worker + 1) * share]


def index_rows(
    num_examples: int,
    global_batch: int,
    *,
    seed: int,
    start_epoch: int,
    epochs: int,
    skip: int,
    worker: int = 0,
    workers: int = 1,
) -> tf.data.Dataset:
    """Rows of :func:`epoch_rows` for epochs ``start_epoch``..``epochs - 1`` back to back, the first
    ``skip`` rows left out (trained on before a resume), one epoch's indices at a time: the order
    of every source read by index (arrays, image files, a decoded cache).
    """
    steps = num_examples // global_batch
    if not 0 <= skip <= steps:
        raise ValueError(f"skip {skip} is outside an epoch of {steps} steps")
    if global_batch % workers:
        raise ValueError(f"global batch {global_batch} does not split over {workers} workers")
    share = global_batch // workers

    def rows_of(epoch):
        rows = tf.numpy_function(
            lambda e: epoch_rows(
                num_examples, global_batch, seed=seed, epoch=int(e), worker=worker, workers=workers
            ),
            [epoch],
            tf.int64,
            stateful=False,
        )
        rows.set_shape([steps, share])
        return tf.data.Dataset.from_tensor_slices(rows)

    return tf.data.Dataset.range(start_epoch, epochs).flat_map(rows_of).skip(skip)


def train_batches(x: np.ndarray, y: np.ndarray, *, global_batch: int, seed: int) -> ShuffledBatches:
    """Seeded, replica-independent training batches of ``global_batch`` examples."""
    return ShuffledBatches(x=x, y=y, global_batch=global_batch, seed=seed)


def eval_dataset(
    x: np.ndarray, y: np.ndarray, *, global_batch: int, worker: int = 0, workers: int = 1
) -> tf.data.Dataset:
    """Every example exactly once, in order; the last batch may be partial. With ``workers``
    > 1, worker ``worker``'s share of each batch (:func:`worker_slice`): over all workers, still
    every example exactly once."""
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    if workers > 1:
        ds = ds.map(
            lambda xb, yb: (worker_slice(xb, worker, workers), worker_slice(yb, worker, workers))
        )
    return finish(ds)


def worker_slice(t: tf.Tensor, worker: int, workers: int) -> tf.Tensor:
    """Worker ``worker``'s contiguous share of a batch: rows ``[w*n//W, (w+1)*n//W)``; every
    row goes to exactly one worker, also in a partial last batch."""
    n = tf.shape(t, out_type=tf.int64)[0]
    return t[worker * n // workers : (worker + 1) * n // workers]


def shuffle(ds: tf.data.Dataset, buffer: int, *, seed, **options) -> tf.data.Dataset:
    """``ds.shuffle(buffer, seed=seed, **options)``, also for a ``seed`` that is a tensor (an epoch
    or a worker index) while a dataset function is traced and the global seed is 0.
    (why: docs/architecture.md#data-sources)
    """
    graph = tf.compat.v1.get_default_graph()
    if (
        tf.executing_eagerly()
        or not tf.is_tensor(seed)
        or graph.seed is None
        or graph.seed % _MAX_INT32
    ):
        return ds.shuffle(buffer, seed=seed, **options)
    global_seed, graph.seed = graph.seed, 1
    try:
        return ds.shuffle(buffer, seed=seed, **options)
    finally:
        graph.seed = global_seed


_MAX_INT32 = 2**31 - 1  # TF folds seeds into [0, 2**31 - 1)


def _to_float(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    # Scale after batching: one vectorised op per batch instead of one per example. uint8 is
    # pixels (0-255 -> [0, 1]); other dtypes are taken as the values the model wants.
    if x.dtype == tf.uint8:
        return tf.cast(x, tf.float32) / 255.0, y
    return tf.cast(x, tf.float32), y


def finish(ds: tf.data.Dataset, *, scaled: bool = False) -> tf.data.Dataset:
    """Batches as the devices take them: uint8 pixels scaled to [0, 1] (other dtypes cast to
    float32; ``scaled``: already done, or not wanted), no automatic sharding (each worker's
    share is chosen by the source), prefetched."""
    if not scaled:
        ds = ds.map(_to_float, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)
