"""``mirrorfit.fit`` under ParameterServerStrategy (``mirrorfit train --strategy
parameter-server`` with a compiled ``--model``): the variables live on the ps tasks, the chief
runs the loop and schedules each call's steps as closures on the free workers (asynchronous:
one optimizer step is one worker's batch, the global batch is per worker), and evaluates on
itself, every example once, as the built-in loop does
(:mod:`mirrorfit.engine.tensorflow.parameter_server`).
(why: docs/architecture.md#tensorflow-parameter-servers)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tensorflow as tf

from mirrorfit.engine.tensorflow.parameter_server import (
    atomic_keras_increments,
    check_no_partitioner,
)
from mirrorfit.engine.tensorflow.shared_copy import increments_only, without_xla
from mirrorfit.errors import FitError
from mirrorfit.fitting import metrics as fit_metrics

if TYPE_CHECKING:
    from collections.abc import Callable


def coordinated(strategy) -> bool:
    """Whether ``strategy`` is a ParameterServerStrategy (its steps are scheduled)."""
    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def check_model(model, strategy) -> None:
    """FitError for what the scheduled steps cannot run: a model's own ``train_step`` or
    ``test_step`` (its logs would stay on whichever worker ran it)."""
    for step in ("train_step", "test_step"):
        if fit_metrics.overrides(model, step):
            raise FitError(
                f"{type(model).__name__}'s own {step} under parameter servers: each step runs "
                "on whichever worker is free, and the logs it returns stay there; use "
                "--strategy multi-worker (mirrorfit.setup(strategy='multi-worker'))"
            )
    check_no_partitioner(strategy, FitError)


class Scheduled:
    """Over :class:`~mirrorfit.engine.tensorflow.keras_fit.Runner` (which mixes it in, as
    ``keras_fit.runner`` picks it): the runner's step, scheduled. ``train`` splits a call's
    steps over the workers (one closure each, its steps in order) and waits for them all, so
    the logs, the checkpoints and the chief's step count agree when it returns."""

    # The Runner's, which this mixes into.
    model: Any
    strategy: Any
    replicas: int
    _divisor: int
    _replica_train: Callable
    _replica_eval: Callable
    _unscaled: Callable
    _own_train: bool
    _own_test: bool
    workers: int

    def __init__(self, model, strategy, **settings) -> None:
        jit = without_xla(model, settings.get("jit_compile", False), "parameter servers")
        super().__init__(model, strategy, **{**settings, "jit_compile": jit})  # type: ignore[call-arg]
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # the one
        self.workers = strategy.extended._num_workers  # noqa: SLF001 (no public count)
        if self.workers > 1 and fit_metrics.output_loss_indices(model):
            # Each worker's padding correction of a per-output loss would read the others'
            # updates of the one shared mean.
            raise FitError(
                f"a model of several outputs ({', '.join(model.output_names)}) under "
                "parameter servers with several workers: its per-output losses are means "
                "that every worker updates in one shared copy, which mirrorfit cannot correct "
                "for a partial batch's padding; train it with --strategy multi-worker"
            )
        # autograph for a model's own compute_loss, as the Runner's own calls
        self._scheduled = tf.function(self._worker_steps, autograph=self._own_train)
        self._on_chief = tf.function(self._chief_batches, autograph=self._own_test)

    def put(self, block: dict):
        """The block as tensors on the chief; a closure takes its steps' slice to its worker."""
        return tf.nest.map_structure(tf.constant, block)

    def train(self, block, steps: int) -> None:
        closures = max(1, min(self.workers, steps))
        bounds = [c * steps // closures for c in range(closures + 1)]
        # Traced at the first schedule, on the chief: Keras's increments (the metrics, the
        # optimizer's iterations) recorded as one atomic op each, on the ps.
        with self._unscaled("train"), self._increments():
            for lo, hi in zip(bounds, bounds[1:]):
                part = tf.nest.map_structure(lambda a, lo=lo, hi=hi: a[lo:hi], block)
                n = tf.constant(hi - lo, tf.int32)
                self.coordinator.schedule(self._scheduled, args=(part, n))
        self.coordinator.join()  # raises a closure's error

    def evaluate(self, block, batches: int) -> None:
        self.coordinator.join()
        self._divisor = 1  # one replica, the chief's: the batch whole
        try:
            with self._unscaled("test"):
                self._on_chief(block, tf.constant(batches, tf.int32))
        finally:
            self._divisor = self.replicas

    def _increments(self):
        if self.workers == 1:  # one writer at a time: Keras's own assigns are right
            return atomic_keras_increments()
        return increments_only(
            self.model, "under parameter servers two workers' assigns lose each other's updates"
        )

    def describe_sharding(self) -> str:
        return "on the ps tasks (one copy, the workers read it each step)"

    def compute_only(self, block, steps: int) -> None:
        raise FitError("--profile under parameter servers: the steps are scheduled; bench it")

    def all_reduce_only(self, steps: int) -> None:
        raise FitError("--profile under parameter servers: the steps are scheduled; bench it")

    def from_chief(self, distribution) -> None:
        """Nothing: the variables are the ps tasks', one copy."""

    def _worker_steps(self, block, n):
        def body(i):
            self.strategy.run(self._replica_share_train, args=(block, i))
            return (i + 1,)

        tf.while_loop(lambda i: i < n, body, (tf.constant(0, tf.int32),))

    def _replica_share_train(self, block, i):
        return self._replica_train(self._share(block), i)

    def _share(self, block):
        """This replica's contiguous share of every batch (several GPUs on one worker; a batch
        not divisible by them, only given to a model's own step, split as evenly as it goes)."""
        if self.replicas == 1:
            return block
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        rows = tf.nest.flatten(block)[0].shape[1]
        lo, hi = r * rows // self.replicas, (r + 1) * rows // self.replicas
        return tf.nest.map_structure(lambda a: a[:, lo:hi], block)

    def _chief_batches(self, block, n):
        # Not strategy.run: that is for scheduled functions; the chief is one replica here.
        def body(i):
            self._replica_eval(block, i)
            return (i + 1,)

        tf.while_loop(lambda i: i < n, body, (tf.constant(0, tf.int32),))
