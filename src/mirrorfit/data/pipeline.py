"""tf.data pipelines that keep the replicas fed.

The training order depends only on (seed, epoch) and the global batch, never on the replica
count: each global batch is split across replicas by ``experimental_distribute_dataset``. That
is what makes 1-vs-N-replica runs comparable and a resume exact.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def _to_float(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    # Scale after batching: one vectorised op per batch instead of one per example.
    return tf.cast(x, tf.float32) / 255.0, y


def epoch_order(num_examples: int, *, seed: int, epoch: int) -> np.ndarray:
    """The permutation of example indices for ``epoch``: seeded, replica-independent."""
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def train_dataset(x: np.ndarray, y: np.ndarray, *, global_batch: int, seed: int,
                  epoch: int) -> tf.data.Dataset:
    """One epoch of shuffled, full global batches (the remainder is dropped), prefetched.

    The shuffle happens in NumPy on indices: cheaper than a tf.data shuffle buffer over images
    and trivially reproducible: a resumed run skips the batches already seen.
    """
    order = epoch_order(len(x), seed=seed, epoch=epoch)
    order = order[:len(order) - len(order) % global_batch]
    ds = tf.data.Dataset.from_tensor_slices((x[order], y[order]))
    return _finish(ds.batch(global_batch, drop_remainder=True))


def eval_dataset(x: np.ndarray, y: np.ndarray, *, global_batch: int) -> tf.data.Dataset:
    """Every example exactly once, in order; the last batch may be partial."""
    return _finish(tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch))


def _finish(ds: tf.data.Dataset) -> tf.data.Dataset:
    ds = ds.map(_to_float, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def steps_per_epoch(num_examples: int, global_batch: int) -> int:
    """Optimizer steps in one epoch (full global batches only)."""
    return num_examples // global_batch
