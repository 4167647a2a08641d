"""Parameter-server training: the ``ClusterCoordinator``-driven counterpart of ``loop.py``.

The variables live on the ps tasks; the chief traces the steps and schedules them as closures
on whichever worker is free (asynchronous: one optimizer step = one worker batch); workers and
ps tasks only serve (:func:`serve`). Steps are counted on the chief; examples are sampled per
worker; evaluation runs on the chief, every example once. Keras 3 needs
:func:`atomic_keras_increments` here, and no ``variable_partitioner``.
(why: docs/architecture.md#tensorflow-parameter-servers)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, NoReturn

import keras
import tensorflow as tf
from keras.src.backend.common.stateless_scope import in_stateless_scope

from mirrorfit.distribute._deadline import deadline
from mirrorfit.distribute._listen import listening
from mirrorfit.engine.backends import COORDINATOR
from mirrorfit.engine.tensorflow.distribution import Distribution
from mirrorfit.errors import ConfigError


def serve(
    cluster_resolver: tf.distribute.cluster_resolver.ClusterResolver | None = None,
) -> NoReturn:
    """Run this process as a ``worker`` or ``ps`` task of ``cluster_resolver`` (default:
    ``TF_CONFIG``) until it is killed (never returns); the chief sends it everything it runs.
    """
    resolver = cluster_resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type not in ("worker", "ps"):
        raise ValueError(
            f"serve() is for worker and ps tasks, not {resolver.task_type!r}; "
            "the chief builds the strategy and drives training"
        )
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()
    raise RuntimeError("tf.distribute.Server.join() returned")  # it does not, but to be sure


@contextlib.contextmanager
def atomic_keras_increments():
    """Within this block, ``keras.Variable.assign_add/assign_sub`` are one ``tf.Variable`` op.

    Use it around *tracing* a ``tf.function``: the ops recorded are atomic on the ps.
    (why: docs/architecture.md#tensorflow-parameter-servers)
    """
    cls = keras.Variable
    saved = {name: cls.__dict__.get(name) for name in ("assign_add", "assign_sub")}
    for name in saved:
        setattr(cls, name, _atomic(name, getattr(cls, name)))
    try:
        yield
    finally:
        for name, method in saved.items():
            if method is None:
                delattr(cls, name)
            else:
                setattr(cls, name, method)


def _atomic(op: str, keras_method: Callable) -> Callable:
    def method(self, value):
        variable = getattr(self, "_value", None)  # the tf.Variable (on a ps) under the Keras one
        if in_stateless_scope() or not isinstance(variable, tf.Variable):
            return keras_method(self, value)
        return getattr(variable, op)(tf.cast(value, variable.dtype))

    return method


@dataclass(frozen=True)
class CoordinatedLoops:
    """The compiled functions a controller drives. Build with :func:`coordinated_loops`."""

    strategy: tf.distribute.Strategy
    coordinator: tf.distribute.coordinator.ClusterCoordinator
    train_steps: Callable  # (per-worker iterator, n: int64 tensor) -> None; scheduled
    evaluate_batches: Callable  # (iterator) -> None; runs on the chief
    num_workers: int

    def per_worker_dataset(
        self, dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset]
    ):
        """An iterator over per-step batches (examples per optimizer step, repeated without end)
        built on each worker by ``dataset_fn(input_context)``; no
        ``tf.numpy_function``/``tf.py_function`` (it runs on the workers);
        ``input_context.input_pipeline_id`` is this worker's index (an int64 tensor). (why:
        docs/architecture.md#tensorflow-parameter-servers)
        """
        num_workers, replicas = self.num_workers, self.strategy.num_replicas_in_sync

        def worker_dataset_fn(_):  # PSS passes one pipeline, id 0: give the real ones
            index = tf.distribute.coordinator.experimental_get_current_worker_index()
            return dataset_fn(
                tf.distribute.InputContext(
                    num_input_pipelines=num_workers,
                    input_pipeline_id=index,
                    num_replicas_in_sync=replicas,
                )
            )

        @tf.function
        def per_worker_dataset():
            return self.strategy.distribute_datasets_from_function(worker_dataset_fn)

        return iter(self.coordinator.create_per_worker_dataset(per_worker_dataset))

    def run_train(self, iterator, num_steps: int) -> None:
        """Run ``num_steps`` optimizer steps (all workers together); return when they are done, with
        weights, metrics and the chief's step count in agreement. Use tens of steps per worker
        (why: docs/architecture.md#tensorflow-parameter-servers).
        """
        closures = max(1, min(self.num_workers, num_steps))
        base, extra = divmod(num_steps, closures)
        for i in range(closures):
            n = base + (1 if i < extra else 0)
            self.coordinator.schedule(self.train_steps, args=(iterator, tf.constant(n, tf.int64)))
        self.coordinator.join()

    def evaluate(self, dataset: tf.data.Dataset) -> None:
        """Run the eval step on the chief over every batch of ``dataset`` (plain, not distributed),
        each example once, after scheduled training has finished; use large batches
        (why: docs/architecture.md#tensorflow-parameter-servers).
        """
        self.coordinator.join()
        # Made eagerly, on the chief: iterating inside the function handles a partial last batch.
        self.evaluate_batches(iter(dataset))

    def join(self) -> None:
        """Wait until every scheduled closure has finished (raises a closure's error)."""
        self.coordinator.join()

    def tracing_count(self) -> int:
        """How often the scheduled train function was traced (should stay 1)."""
        return self.train_steps.experimental_get_tracing_count()


def check_no_partitioner(strategy, error: type[Exception] = ValueError) -> None:
    """``error`` for a ParameterServerStrategy with a ``variable_partitioner``, which Keras 3
    cannot train (why: docs/architecture.md#tensorflow-parameter-servers)."""
    if getattr(strategy.extended, "_variable_partitioner", None) is not None:
        raise error(
            "ParameterServerStrategy with a variable_partitioner cannot train Keras 3 "
            "models on TF 2.21 (ShardedVariable has no .handle for GradientTape, and "
            "the Keras optimizer cannot update it; benchmarks/repro/"
            "ps_keras3_partitioner.py); build the strategy without one"
        )


def coordinated_loops(
    strategy: tf.distribute.Strategy,
    coordinator: tf.distribute.coordinator.ClusterCoordinator,
    train_fn: Callable,
    eval_fn: Callable,
) -> CoordinatedLoops:
    """Wrap per-replica ``train_fn(x, y)`` and ``eval_fn(x, y)`` (e.g. a ``ReplicaStep``'s) for
    ``ParameterServerStrategy``: training scheduled on the workers, evaluation on the chief.
    ``train_fn`` is one optimizer step on one worker's batch (its "global batch").
    """
    check_no_partitioner(strategy)
    # PSS exposes no public worker count (strategy.cluster_resolver is None for it).
    num_workers = strategy.extended._num_workers

    @tf.function
    def train_steps(iterator, num_steps):
        # Traced once on the chief, at the first schedule; the patch covers that trace only.
        with atomic_keras_increments():
            for _ in tf.range(num_steps):
                strategy.run(train_fn, args=next(iterator))

    @tf.function
    def evaluate_batches(iterator):
        # Not strategy.run: that is for scheduled functions (PSS warns when the chief calls it).
        # One replica on the chief, the metrics' only writer while workers are idle.
        for x, y in iterator:
            eval_fn(x, y)

    return CoordinatedLoops(
        strategy=strategy,
        coordinator=coordinator,
        train_steps=train_steps,
        evaluate_batches=evaluate_batches,
        num_workers=num_workers,
    )


def build_parameter_server(setup, cluster, *, timeout_s: float):
    """The chief's :class:`~mirrorfit.engine.tensorflow.strategy.Distribution` for ``cluster`` (with
    ps tasks): ParameterServerStrategy and its ClusterCoordinator. Under it one optimizer step
    is one worker's batch, so ``replicas`` is the replicas of one worker (1 on CPUs) and the
    global batch is per worker."""
    if not cluster.is_chief:
        raise ConfigError(f"{cluster.task_name()} serves; only the chief builds the strategy")
    # Connecting to the workers and ps waits for them inside TF's C++, for ever: a watchdog
    # process names the ones missing after the timeout.
    with deadline(
        timeout_s,
        f"did not come up within {timeout_s:g} s; check that every task "
        "started (its log), or raise --collective-timeout",
        cluster.peers(),
    ):
        with listening(cluster):  # the chief's own server starts in the strategy
            strategy = tf.distribute.experimental.ParameterServerStrategy(cluster.tf_resolver())
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    return Distribution(
        strategy=strategy,
        kind="parameter-server",
        replicas=strategy.num_replicas_in_sync,
        local_replicas=strategy.num_replicas_in_sync,
        workers=cluster.num_workers,
        is_chief=True,
        input_split=COORDINATOR,
        task=cluster.task_name(),
        coordinator=coordinator,
        cluster=cluster,
    )


def start_server(cluster) -> tf.distribute.Server:
    """This ``worker`` or ``ps`` task's server, started, on its own address (see
    :func:`~mirrorfit.distribute._listen.listening`)."""

    resolver = cluster.tf_resolver()
    with listening(cluster):
        return tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=cluster.task_type,
            task_index=cluster.task_index,
            protocol="grpc",
            start=True,
        )


def serve_task(cluster, *, console=None) -> NoReturn:
    """What a ``worker`` or ``ps`` task of ``mirrorfit train --strategy parameter-server`` does:
    serve the chief; after a SIGTERM/SIGINT, until the chief's port is closed, then exit 0 (a
    second signal ends it at once). (why: docs/architecture.md#tensorflow-parameter-servers)
    """
    import os
    import signal
    import socket
    import time

    signals: list[int] = []

    def on_signal(signum, frame) -> None:
        if signals:
            os._exit(128 + signum)
        signals.append(signum)

    start_server(cluster)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    if console is not None:
        console.print(f"{cluster.describe()}: serving the chief's steps until stopped")
    host, _, port = cluster.address("chief", 0).rpartition(":")
    while True:  # the server runs on TF's threads; this thread only waits, so signals land
        time.sleep(0.5)
        if signals:
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
            except OSError:  # the chief is gone: nothing left to serve
                os._exit(0)


__all__ = [
    "CoordinatedLoops",
    "build_parameter_server",
    "coordinated_loops",
    "serve",
    "serve_task",
    "atomic_keras_increments",
]
