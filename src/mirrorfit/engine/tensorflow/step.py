"""What runs on each replica: forward, loss over the *global* batch, backward, update.

Run inside ``strategy.run``; ``loop.py`` compiles them. The Keras optimizer all-reduces the
gradients once per optimizer step (K micro-batches summed locally first). ``jit_compile``
compiles only the forward and backward pass (why: docs/architecture.md#tensorflow-the-step).
"""

from __future__ import annotations

from typing import Callable, Sequence

import keras
import tensorflow as tf


def per_example_loss(loss: Callable, y: tf.Tensor, pred: tf.Tensor) -> tf.Tensor:
    """Unreduced float32 loss, one value per example, for a Keras Loss or a loss function."""
    pred = tf.cast(pred, tf.float32)
    values = loss.call(y, pred) if isinstance(loss, keras.losses.Loss) else loss(y, pred)
    return tf.cast(values, tf.float32)


class ReplicaStep:
    """Per-replica train and eval computations for one model. ``global_batch`` (examples per
    optimizer step, all replicas and micro-batches) scales the loss so the replicas' summed
    gradients are the global-batch mean's; ``accum_steps`` K splits each replica's batch into K
    micro-batches run one after another.
    """

    def __init__(
        self,
        *,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        loss: Callable,
        train_metrics: Sequence[keras.metrics.Metric],
        eval_metrics: Sequence[keras.metrics.Metric],
        global_batch: int,
        num_replicas: int,
        accum_steps: int = 1,
        jit_compile: bool = False,
        metrics_outside: bool = False,
    ) -> None:
        self.model, self.optimizer, self.loss = model, optimizer, loss
        # Central storage: a metric variable is one AggregatingVariable, and Keras's
        # assign_add (an assign of v + x) summed over replicas doubles it each step. The
        # replicas then return (y, per-example loss, predictions) and the loop updates the
        # metrics once, in cross-replica context (update_train_metrics, update_eval_metrics).
        self.metrics_outside = metrics_outside
        self.train_metrics, self.eval_metrics = list(train_metrics), list(eval_metrics)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.eval_loss_tracker = keras.metrics.Mean(name="loss")
        self.global_batch, self.num_replicas = global_batch, num_replicas
        self.accum_steps = accum_steps
        self.loss_scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self.jit_compile = jit_compile
        self.gradients = (
            tf.function(self._gradients, jit_compile=True) if jit_compile else self._gradients
        )

    def _gradients(self, x: tf.Tensor, y: tf.Tensor):
        """Forward and backward on one micro-batch: (gradients, per-example loss, predictions).

        Gradients are of the (loss-scaled, under fp16) share of the global-batch mean loss.
        """
        with tf.GradientTape() as tape:
            pred = self.model(x, training=True)
            per_example = per_example_loss(self.loss, y, pred)
            loss = tf.reduce_sum(per_example) / self.global_batch
            if self.model.losses:  # regularisers: once per optimizer step over all replicas
                loss += tf.add_n(self.model.losses) / (self.num_replicas * self.accum_steps)
            scaled = self.optimizer.scale_loss(loss)
        variables = self.model.trainable_variables
        grads = tape.gradient(scaled, variables)
        grads = [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)]
        return grads, per_example, pred

    def train(self, x: tf.Tensor, y: tf.Tensor):
        """One optimizer step on this replica's share of a global batch; with
        ``metrics_outside``, returns what updates the metrics: (y, per-example loss, preds)."""
        if self.accum_steps == 1:
            grads, per_example, pred = self.gradients(x, y)
            seen = (y, per_example, pred)
            if not self.metrics_outside:
                self.update_train_metrics(*seen)
        else:
            grads, seen = self._accumulate(x, y)
        if self.loss_scaling:
            grads = _agree_on_overflow(grads)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return seen if self.metrics_outside else None

    def _accumulate(self, x: tf.Tensor, y: tf.Tensor):
        """(summed gradients, and with ``metrics_outside`` the micro-batches' (y, per-example
        loss, predictions) concatenated; else None)."""
        # [K*b, ...] -> [K, b, ...]; the pipeline batched K micro-batches per replica.
        k = self.accum_steps
        xs = tf.reshape(x, tf.concat([[k, -1], tf.shape(x)[1:]], 0))
        ys = tf.reshape(y, tf.concat([[k, -1], tf.shape(y)[1:]], 0))
        outside = self.metrics_outside

        def micro_batch(i, total, seen):
            grads, per_example, pred = self.gradients(xs[i], ys[i])
            if outside:
                got = (ys[i], tf.cast(per_example, tf.float32), tf.cast(pred, tf.float32))
                seen = [a.write(i, t) for a, t in zip(seen, got)]
            else:
                self.update_train_metrics(ys[i], per_example, pred)
            return i + 1, [t + g for t, g in zip(total, grads)], seen

        total = [tf.zeros_like(v) for v in self.model.trainable_variables]
        seen = (
            [tf.TensorArray(d, size=k) for d in (y.dtype, tf.float32, tf.float32)]
            if outside
            else []
        )
        _, total, seen = tf.while_loop(
            lambda i, *_: i < k, micro_batch, (tf.constant(0), total, seen)
        )
        return total, tuple(a.concat() for a in seen) if outside else None

    def update_train_metrics(self, y, per_example, pred) -> None:
        self.loss_tracker.update_state(per_example)
        for metric in self.train_metrics:
            metric.update_state(y, pred)

    def evaluate(self, x: tf.Tensor, y: tf.Tensor):
        """Evaluate this replica's batch; with ``metrics_outside``, returns (y, per-example
        loss, predictions) for :meth:`update_eval_metrics`."""
        pred = self.model(x, training=False)
        seen = (y, per_example_loss(self.loss, y, pred), pred)
        if self.metrics_outside:
            return seen
        self.update_eval_metrics(*seen)
        return None

    def update_eval_metrics(self, y, per_example, pred) -> None:
        self.eval_loss_tracker.update_state(per_example)
        for metric in self.eval_metrics:
            metric.update_state(y, pred)


def _agree_on_overflow(grads: list[tf.Tensor]) -> list[tf.Tensor]:
    """Make every replica see non-finite gradients if any replica has them (one scalar all-reduce).
    (why: docs/architecture.md#tensorflow-the-step)
    """
    local_bad = tf.cast(
        tf.logical_not(tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])),
        tf.float32,
    )
    context = tf.distribute.get_replica_context()
    any_bad = context.all_reduce(tf.distribute.ReduceOp.SUM, local_bad) > 0
    return [
        tf.where(any_bad, tf.fill(tf.shape(g), tf.constant(float("nan"), g.dtype)), g)
        for g in grads
    ]
