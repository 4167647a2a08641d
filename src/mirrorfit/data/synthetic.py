"""Synthetic data for examples/s, never accuracy (random labels): one batch of random data made
once per worker and repeated, as TensorFlow's and Horovod's synthetic benchmarks do, so
throughput counts the model, the step and the all-reduce only. :func:`synthetic_batches`
has the training-data protocol of :class:`~mirrorfit.data.pipeline.ShuffledBatches`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from mirrorfit.data._tf import tf

from mirrorfit.data.pipeline import DataOrder
from mirrorfit.errors import ConfigError

if TYPE_CHECKING:
    from mirrorfit.data.arrays import Options
    from mirrorfit.data.opened import Data

DTYPES = ("float32", "bfloat16", "float16")
SYNTHETIC_STEPS = 100  # global batches per synthetic epoch unless --train-examples says


@dataclass(frozen=True)
class SyntheticBatches:
    """Random training batches: ``input_shape`` (one example, no batch axis) with values
    uniform in [0, 1) as scaled pixels are, integer labels uniform in [0, ``num_classes``).
    An epoch is ``steps_per_epoch`` global batches of ``global_batch`` examples. Build with
    :func:`synthetic_batches`."""

    input_shape: tuple[int, ...]
    num_classes: int
    global_batch: int
    steps_per_epoch: int
    seed: int = 42
    dtype: str = "float32"

    @property
    def order(self) -> DataOrder:
        """What a checkpoint records of the data: another shape, class count or dtype is other
        data (the fingerprint), as another file would be."""
        what = f"synthetic {self.input_shape} {self.num_classes} {self.dtype}"
        return DataOrder(
            seed=self.seed,
            examples=self.steps_per_epoch * self.global_batch,
            global_batch=self.global_batch,
            fingerprint=hashlib.blake2b(what.encode(), digest_size=8).hexdigest(),
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
        """Batches for epochs ``start_epoch``..``epochs - 1`` less the first ``skip`` (the
        trainer's protocol); each element is worker ``worker``'s share of a global batch,
        ``global_batch // workers`` examples: (x of ``dtype``, y int32). Every element is the
        same batch, made once when the dataset is first iterated."""
        if not 0 <= skip <= self.steps_per_epoch:
            raise ValueError(f"skip {skip} is outside an epoch of {self.steps_per_epoch} steps")
        if self.global_batch % workers:
            raise ValueError(
                f"global batch {self.global_batch} does not split over {workers} workers"
            )
        count = max(0, (epochs - start_epoch) * self.steps_per_epoch - skip)
        return self._repeated(self.global_batch // workers, tf.constant(worker, tf.int64), count)

    def sampled(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        """For parameter-server workers: an endless stream of global batches, made on the
        worker (pure TensorFlow; ``context.input_pipeline_id`` is a tensor there)."""
        worker = tf.cast(context.input_pipeline_id, tf.int64)
        return self._repeated(self.global_batch, worker, -1)

    def _repeated(self, size: int, worker: tf.Tensor, count: int) -> tf.data.Dataset:
        # Made inside the pipeline and cached, not passed in with from_tensors: a batch built
        # outside would be a constant in the dataset's graph (tens of MB for 224x224 images),
        # serialised each time the dataset is copied to a worker or rewritten.
        def make(_):
            return self._batch(size, worker)

        ds = tf.data.Dataset.range(1).map(make).cache().repeat(count)
        options = tf.data.Options()
        # Each worker's share is made here: tf.data must not shard it again.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return ds.with_options(options).prefetch(1)

    def _batch(self, size: int, worker: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``size`` examples from seed (run seed, worker): reproducible, different per worker."""
        seed = tf.stack([tf.constant(self.seed, tf.int64), worker])
        x = tf.random.stateless_uniform([size, *self.input_shape], seed=seed, dtype=tf.float32)
        y = tf.random.stateless_uniform(
            [size], seed=seed + [0, 1 << 20], minval=0, maxval=self.num_classes, dtype=tf.int32
        )
        return tf.cast(x, self.dtype), y

    def host_batch(self, worker: int = 0, workers: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Worker ``worker``'s share of one global batch as NumPy arrays (the JAX engine's
        repeated batch): x uniform in [0, 1) of ``dtype``, y int32; seeded by (seed, worker)."""
        rng = np.random.default_rng([self.seed, worker, 1 << 20])
        size = self.global_batch // workers
        x = rng.random((size, *self.input_shape), dtype=np.float32)
        y = rng.integers(0, self.num_classes, size=size, dtype=np.int32)
        if self.dtype != "float32":
            import ml_dtypes  # bfloat16 for NumPy; Keras and JAX bring it

            x = x.astype(ml_dtypes.bfloat16 if self.dtype == "bfloat16" else np.float16)
        return x, y

    def arrays(self, examples: int, *, split: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``examples`` random examples as NumPy arrays for validation or test (keep it small):
        x uint8 pixels in [0, 255] (the evaluation pipeline scales them to [0, 1], as it does
        MNIST's), y int32. ``split`` picks another draw (1: validation, 2: test, say)."""
        rng = np.random.default_rng([self.seed, split])
        x = rng.integers(0, 256, size=(examples, *self.input_shape), dtype=np.uint8)
        y = rng.integers(0, self.num_classes, size=examples, dtype=np.int32)
        return x, y


def synthetic_batches(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    global_batch: int,
    steps_per_epoch: int,
    seed: int = 42,
    dtype: str = "float32",
) -> SyntheticBatches:
    """Random training data of ``input_shape`` (one example's shape, e.g. (224, 224, 3) pixels
    x channels) and ``num_classes`` labels: ``steps_per_epoch`` global batches of
    ``global_batch`` examples per epoch, made once per worker from ``seed`` and repeated.
    ``dtype``: the images' (float32, bfloat16 or float16). ConfigError for bad values."""
    shape = tuple(input_shape)
    if not shape or not all(
        isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape
    ):
        raise ConfigError(
            f"--input-shape must be positive integers (e.g. 224,224,3), got "
            f"{','.join(map(str, shape)) or 'nothing'}"
        )
    for flag, value, least in (
        ("--num-classes", num_classes, 2),
        ("--global-batch-size", global_batch, 1),
        ("steps per epoch", steps_per_epoch, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"{flag} must be an integer >= {least}, got {value!r}")
    if dtype not in DTYPES:
        raise ConfigError(f"synthetic data dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return SyntheticBatches(
        input_shape=shape,
        num_classes=num_classes,
        global_batch=global_batch,
        steps_per_epoch=steps_per_epoch,
        seed=seed,
        dtype=dtype,
    )


def open_train(o: Options) -> Data:
    """Random training batches (no validation or test: nothing is learnt from them)."""
    from mirrorfit.data.opened import Data
    from mirrorfit.models.names import IMAGENET_CLASSES, default_input_shape, is_application

    application = is_application(o.model)
    shape = (
        tuple(o.input_shape)
        if o.input_shape is not None
        else (default_input_shape(o.model) if application else (28, 28))
    )
    classes = o.num_classes or (IMAGENET_CLASSES if application else 10)
    examples = o.train_examples or SYNTHETIC_STEPS * o.global_batch
    train = synthetic_batches(
        input_shape=shape,
        num_classes=classes,
        global_batch=o.global_batch,
        steps_per_epoch=max(1, examples // o.global_batch),
        seed=o.seed,
    )
    return Data(
        train=train,
        val=None,
        test=None,
        input_shape=shape,
        num_classes=classes,
        kind="synthetic",
        source="synthetic",
        fingerprint=train.order.fingerprint,
        description=f"synthetic data ({train.steps_per_epoch} steps per epoch of random "
        f"examples of shape {shape}, {classes} classes; no validation or "
        "test: nothing is learnt from it)",
    )


__all__ = ["SyntheticBatches", "synthetic_batches", "DTYPES", "open_train"]
