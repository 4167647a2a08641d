"""Run by tests/engine/tensorflow/test_strategy.py: ``python host_feed_driver.py``. With GPUs
hidden, on 2 logical CPU replicas: whether each strategy's distribution feeds from the host,
and how a mirrored one cuts 20 rows in batches of 8 (the last partial) into per-replica
pieces inside the step, against TF's own distributed dataset; a batch already cut per replica
passes through; a sparse dataset goes to TF's. Prints one JSON line of those."""

import os

os.environ["CUDA_VISIBLE_DEVICES"] = ""

import json  # noqa: E402

import mirrorfit  # noqa: E402
import tensorflow as tf  # noqa: E402
from mirrorfit.engine.tensorflow.strategy import build_distribution  # noqa: E402

setup = mirrorfit.configure_devices(replicas=2)
out = {}
for kind in ("mirrored", "central-storage"):
    d = build_distribution(setup, kind=kind)
    out[kind] = d.feeds_from_host

d = build_distribution(setup, kind="mirrored")
rows = tf.data.Dataset.range(20).map(lambda i: (tf.fill([2], i), i * 10))


def make(worker, workers):
    return rows.batch(8)  # 8, 8, then a partial batch of 4


fed = d.distribute(make, per_replica=4)
out["plain"] = isinstance(fed, tf.data.Dataset)


@tf.function
def pieces(batch):
    return d.strategy.run(lambda x, y: (x[:, 0], y), args=d.split(batch))


got = []
for batch in fed:
    x, y = pieces(batch)
    got.append([[int(v) for v in t.numpy()] for t in d.strategy.experimental_local_results(x)])
    assert [list(t.numpy()) for t in d.strategy.experimental_local_results(y)] == [
        [10 * v for v in piece] for piece in got[-1]
    ]
out["pieces"] = got
# TF's own distributed dataset cuts a full batch the same way
theirs = next(iter(d.strategy.experimental_distribute_dataset(rows.batch(8))))[0]
out["theirs"] = [
    [int(v) for v in t.numpy()[:, 0]] for t in d.strategy.experimental_local_results(theirs)
]
# a batch already cut per replica (a distributed iterator's) passes through split
whole = next(iter(d.strategy.experimental_distribute_dataset(rows.batch(8))))
x, _ = d.strategy.run(lambda x, y: (x, y), args=d.split(whole))
out["through"] = [int(t.shape[0]) for t in d.strategy.experimental_local_results(x)]
# sparse components: TF's distributed dataset cuts them
sparse = tf.data.Dataset.from_tensor_slices(tf.sparse.from_dense(tf.eye(8))).batch(4)
out["sparse_plain"] = isinstance(d.distribute(lambda w, n: sparse, per_replica=2), tf.data.Dataset)
print(json.dumps(out))
