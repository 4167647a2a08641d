"""Keras 3 on TF 2.21 under ParameterServerStrategy: increments of Keras variables are lost.

``keras.Variable.assign_add(v)`` is ``assign(self + v)`` (keras/src/backend/common/variables.py):
read on the parameter server, add on the worker, write back. Two workers doing it at once
overwrite each other's increments. ``tf.Variable.assign_add`` is one atomic op on the parameter
server and loses nothing. What uses the Keras path: every metric (``Mean.update_state``:
``total.assign_add``, ``count.assign_add``) and the optimizer's step counter
(``BaseOptimizer.apply``: ``self._iterations.assign_add(1)``, read by Adam's bias correction and
learning-rate schedules). Weight and slot updates go through ``TFOptimizer.assign_sub/assign_add``
(tf.Variable ops) and are not affected.

Run: python benchmarks/repro/ps_keras3_lost_updates.py   (1 ps + 2 workers, in-process, ~15 s)
Prints the counts and exits 1 while the bug is present.
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
    {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)], "ps": [f"127.0.0.1:{free_port()}"]}
)
# In-process servers share one inter-op pool; on a 2-core machine its default size deadlocks
# (the TF parameter-server tutorial sets the same).
config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
servers = [
    tf.distribute.Server(
        cluster, job_name=job, task_index=i, protocol="grpc", config=config, start=True
    )
    for job, i in (("worker", 0), ("worker", 1), ("ps", 0))
]
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

with strategy.scope():
    tf_counter = tf.Variable(0.0)
    metric = keras.metrics.Sum()
    weight = keras.Variable([1.0])
    optimizer = keras.optimizers.SGD(0.0)
    optimizer.build([weight])

STEPS, CLOSURES = 200, 20


@tf.function
def increment(n):
    def replica_fn():
        tf_counter.assign_add(1.0)  # tf.Variable: atomic on the ps
        metric.update_state(1.0)  # keras metric: total.assign(total + 1)
        optimizer.apply_gradients([(tf.zeros([1]), weight)])  # iterations.assign_add(1)

    for _ in tf.range(n):
        strategy.run(replica_fn)


for _ in range(CLOSURES):
    coordinator.schedule(increment, args=(tf.constant(STEPS),))
coordinator.join()
expected = STEPS * CLOSURES
got = {
    "tf.Variable.assign_add": float(tf_counter.numpy()),
    "keras.metrics.Sum": float(metric.result()),
    "optimizer.iterations": int(optimizer.iterations.numpy()),
}
for name, value in got.items():
    print(f"{name:24s} {value:8.0f} of {expected} ({expected - value:.0f} lost)")
lost = any(v != expected for v in got.values())
print("BUG PRESENT: Keras variable increments race between workers" if lost else "no lost updates")
sys.exit(1 if lost else 0)
