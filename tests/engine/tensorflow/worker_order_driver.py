"""Run by tests/engine/tensorflow/test_multi_worker.py as each task of `mirrorfit launch
--workers 2`: ``python worker_order_driver.py``. A multi-worker distribution (one CPU replica
a worker) reads its share of two epochs of 200 numbered examples, global batch 16. Prints one
JSON line: the labels this worker saw per step, the epochs' batches in the one-process order,
and the settings its collective server was started with."""

import json
import os

os.environ["CUDA_VISIBLE_DEVICES"] = ""

import numpy as np  # noqa: E402

from mirrorfit.distribute.cluster import cluster_for  # noqa: E402
from mirrorfit.engine.tensorflow.devices import configure_devices  # noqa: E402
from mirrorfit.engine.tensorflow.strategy import build_distribution  # noqa: E402
from mirrorfit.data.pipeline import train_batches  # noqa: E402

n, batch = 200, 16  # 12 steps of 16 per epoch; 8 examples dropped each epoch
dist = build_distribution(
    configure_devices(),
    kind="multi-worker",
    cluster=cluster_for("multi-worker"),
    collective_timeout_s=60,
)
x = np.arange(n, dtype=np.uint8).reshape(n, 1)
y = np.arange(n, dtype=np.int64)
batches = train_batches(x, y, global_batch=batch, seed=3)
it = iter(
    dist.distribute(
        lambda w, W: batches.dataset(epochs=2, worker=w, workers=W),
        per_replica=batch // dist.replicas,
    )
)
seen = [
    [int(v) for v in dist.strategy.experimental_local_results(next(it)[1])[0]]
    for _ in range(2 * batches.steps_per_epoch)
]

from tensorflow.python.eager import context  # noqa: E402

# What this worker's collective server was started with (a private TF record: if it moves,
# only the test that reads it fails), and what the context keeps for later servers.
server = getattr(context.context(), "_collective_ops_server_def", None)
print(
    json.dumps(
        {
            "worker": dist.worker_index,
            "seen": seen,
            "expected": [batches.epoch_batches(e).tolist() for e in (0, 1)],
            "recv_buf_max_chunk": server
            and server.default_session_config.experimental.recv_buf_max_chunk,
            "context_recv_buf_max_chunk": context.context().config.experimental.recv_buf_max_chunk,
        }
    )
)
