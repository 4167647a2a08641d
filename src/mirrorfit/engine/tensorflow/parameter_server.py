"""Parameter-server training's strategy and tasks: ``ParameterServerStrategy`` with its
``ClusterCoordinator`` for the chief (:func:`build_parameter_server`), and the worker and ps
tasks that only serve (:func:`serve`, :func:`serve_task`). The variables live on the ps tasks;
the chief's fit schedules the steps as closures on whichever worker is free
(``coordinated_fit.py``). Keras 3 needs :func:`atomic_keras_increments` here, and no
``variable_partitioner``.
(why: docs/architecture.md#tensorflow-parameter-servers)
"""

from __future__ import annotations

import contextlib
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
    "build_parameter_server",
    "serve",
    "serve_task",
    "atomic_keras_increments",
]
