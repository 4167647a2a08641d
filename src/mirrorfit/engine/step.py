"""What runs on each replica: forward, loss over the *global* batch, backward, update.

These functions run inside ``strategy.run``; the loop module compiles them into multi-step
``tf.function``s. Gradients are all-reduced once per step by the Keras optimizer
(one batched ``all_reduce`` of every gradient) and applied once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import keras
import tensorflow as tf


def per_example_loss(loss: Callable, y: tf.Tensor, pred: tf.Tensor) -> tf.Tensor:
    """Unreduced float32 loss, one value per example, for a Keras Loss or a loss function."""
    pred = tf.cast(pred, tf.float32)
    values = loss.call(y, pred) if isinstance(loss, keras.losses.Loss) else loss(y, pred)
    return tf.cast(values, tf.float32)


@dataclass(frozen=True)
class ReplicaStep:
    """Per-replica train and eval computations for one model.

    ``global_batch`` (examples per step over all replicas) scales the loss so that summing the
    replicas' gradients gives the gradient of the global-batch mean: the same update as one
    device on the whole batch.
    """

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    loss: Callable
    train_metrics: Sequence[keras.metrics.Metric]
    eval_metrics: Sequence[keras.metrics.Metric]
    loss_tracker: keras.metrics.Mean
    eval_loss_tracker: keras.metrics.Mean
    global_batch: int
    num_replicas: int

    def train(self, x: tf.Tensor, y: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            pred = self.model(x, training=True)
            per_example = per_example_loss(self.loss, y, pred)
            loss = tf.reduce_sum(per_example) / self.global_batch
            if self.model.losses:  # regularisers: added once per step over all replicas
                loss += tf.add_n(self.model.losses) / self.num_replicas
        variables = self.model.trainable_variables
        grads = tape.gradient(loss, variables)
        self.optimizer.apply_gradients(zip(grads, variables))
        self.loss_tracker.update_state(per_example)
        for metric in self.train_metrics:
            metric.update_state(y, pred)

    def evaluate(self, x: tf.Tensor, y: tf.Tensor) -> None:
        pred = self.model(x, training=False)
        self.eval_loss_tracker.update_state(per_example_loss(self.loss, y, pred))
        for metric in self.eval_metrics:
            metric.update_state(y, pred)
