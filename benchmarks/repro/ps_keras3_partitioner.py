"""Keras 3 on TF 2.21 under ParameterServerStrategy: ``variable_partitioner`` breaks training.

With a partitioner, PSS creates a ``ShardedVariable`` for a large weight and Keras 3 wraps it
in a ``keras.Variable``. The forward pass works (the shards are concatenated), but
``GradientTape.gradient(loss, model.trainable_variables)`` asks each Keras variable for
``.handle`` (keras/src/backend/tensorflow/core.py: ``return self.value.handle``) and
``ShardedVariable`` has none:

    AttributeError: 'ShardedVariable' object has no attribute 'handle'

Differentiating the shards (tf.Variables) instead gets past the tape; then the Keras optimizer
fails in ``TFOptimizer._distributed_tf_update_step`` -> ``strategy.extended.update(var)``:

    NotImplementedError: ShardedVariable doesn't support being used as a reference.

So partitioned variables would need an update step of our own per shard. Without a
partitioner every variable lives whole on one ps (round-robin over the ps tasks), which is what
mirrorfit uses.

Run: python benchmarks/repro/ps_keras3_partitioner.py   (2 ps + 1 worker in-process, ~10 s)
Exits 1 while the bug is present.
"""

import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


cluster = tf.train.ClusterSpec(
    {"worker": [f"127.0.0.1:{free_port()}"], "ps": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
)
config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)  # in-process: see TF tutorial
servers = [
    tf.distribute.Server(
        cluster, job_name=job, task_index=i, protocol="grpc", config=config, start=True
    )
    for job, i in (("worker", 0), ("ps", 0), ("ps", 1))
]
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
strategy = tf.distribute.experimental.ParameterServerStrategy(
    resolver, variable_partitioner=partitioner
)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
print("kernel is", type(model.weights[0].value).__name__)


@tf.function
def keras_gradients(x):
    def replica_fn(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return tape.gradient(loss, model.trainable_variables)[0]

    return strategy.run(replica_fn, args=(x,))


@tf.function
def shard_gradients_then_keras_update(x):
    def replica_fn(x):
        # Differentiate the shards themselves (tf.Variables): the tape is happy ...
        parts = [list(getattr(v.value, "variables", [v.value])) for v in model.trainable_variables]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        grads = [tf.concat(g, 0) for g in tape.gradient(loss, parts)]
        # ... but the Keras optimizer updates through strategy.extended.update(ShardedVariable).
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return strategy.run(replica_fn, args=(x,))


failed = False
for name, fn in (
    ("tape.gradient(model.trainable_variables)", keras_gradients),
    ("shard gradients + optimizer.apply_gradients", shard_gradients_then_keras_update),
):
    try:
        coordinator.schedule(fn, args=(tf.ones([3, 4]),))
        coordinator.join()
        print(f"{name}: works")
    except (AttributeError, NotImplementedError) as e:
        failed = True
        print(f"BUG PRESENT in {name}: {str(e).strip().splitlines()[-1].strip()}")
sys.exit(1 if failed else 0)
