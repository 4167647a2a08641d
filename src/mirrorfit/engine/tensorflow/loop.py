"""Compile the per-replica step into multi-step ``tf.function``s, once: ``train_steps(iterator,
n)`` runs ``n`` steps in one call (``n`` a tensor: the shorter last call does not retrace).
(why: docs/architecture.md#tensorflow-steps-per-call)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import tensorflow as tf


@dataclass(frozen=True)
class CompiledLoops:
    """The compiled functions a controller drives. Build with :func:`compile_loops`."""

    train_steps: Callable[[object, tf.Tensor], None]
    evaluate_batches: Callable[[object], None]  # any iterator, a distributed one too
    evaluate_plain: Callable[[object], None] | None = None  # a plain dataset's iterator

    def run_train(self, iterator, num_steps: int) -> None:
        """Run ``num_steps`` optimizer steps from the distributed ``iterator``."""
        self.train_steps(iterator, tf.constant(num_steps, tf.int64))

    def evaluate(self, dist_dataset) -> None:
        """Run the eval step on every batch of the distributed dataset, each example once."""
        # The iterator is made here, eagerly, as TF asks: made inside the tf.function, TF's
        # multi-device iterator reads the dataset's options in graph mode, which warns
        # (UserWarning: "...the options value is in general no longer known...").
        plain = isinstance(dist_dataset, tf.data.Dataset) and self.evaluate_plain is not None
        (self.evaluate_plain if plain else self.evaluate_batches)(iter(dist_dataset))

    def tracing_count(self) -> int:
        """How often the train function was traced (should stay 1)."""
        return self.train_steps.experimental_get_tracing_count()


def compile_loops(
    strategy: tf.distribute.Strategy,
    train_fn: Callable,
    eval_fn: Callable,
    split: Callable = lambda batch: batch,
    after_train: Callable | None = None,
    after_eval: Callable | None = None,
) -> CompiledLoops:
    """Wrap per-replica ``train_fn(x, y)`` and ``eval_fn(x, y)`` in ``strategy.run`` loops.
    ``split`` turns what the iterator yields into ``strategy.run``'s arguments
    (:meth:`mirrorfit.engine.tensorflow.strategy.Distribution.split`). ``after_train`` and
    ``after_eval``, if given, get what the replicas returned, concatenated over replicas, in
    cross-replica context."""

    def run(fn, after, batch):
        out = strategy.run(fn, args=split(batch))
        if after is not None:
            after(*(tf.concat(strategy.experimental_local_results(t), axis=0) for t in out))

    # Written as a while loop, not traced by AutoGraph: converting the step and the Keras code
    # it calls took ~1 s of the default job's start (the first call), for the same graph.
    @tf.function(autograph=False)
    def train_steps(iterator, num_steps):
        def one_step(i):
            run(train_fn, after_train, next(iterator))
            return (i + 1,)

        tf.while_loop(lambda i: i < num_steps, one_step, (tf.constant(0, num_steps.dtype),))

    @tf.function
    def evaluate_batches(iterator):
        # Iterating inside the function (get_next_as_optional) handles a partial last batch:
        # some replicas may get fewer (or zero) examples, none is counted twice.
        for batch in iterator:
            run(eval_fn, after_eval, batch)

    # A plain dataset's iterator (replicas on this host's CPUs): the same loop, written out and
    # not converted by AutoGraph (its Optional-per-batch loop cost ~30% of the validation).
    @tf.function(autograph=False)
    def evaluate_plain(iterator):
        def one_batch(batch):
            run(eval_fn, after_eval, batch.get_value())
            return (iterator.get_next_as_optional(),)

        tf.while_loop(
            lambda batch: batch.has_value(), one_batch, (iterator.get_next_as_optional(),)
        )

    return CompiledLoops(
        train_steps=train_steps, evaluate_batches=evaluate_batches, evaluate_plain=evaluate_plain
    )
