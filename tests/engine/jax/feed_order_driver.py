"""Run by tests/engine/jax/test_jax_runner.py: ``python feed_order_driver.py``. The same
MNIST batches (640 examples, global batch 32, from epoch 1 less its first 3 steps) read by
the TensorFlow pipeline and by the JAX engine's Feed, in calls of 4 steps on one device.
Prints one JSON line: how many batches each read, the largest difference of their images,
and whether every label matched."""

import json

import numpy as np

import mirrorfit
from mirrorfit.engine.jax.feed import Feed, plan

data = mirrorfit.load_mnist(train_examples=640, download=False)
batches = mirrorfit.train_batches(data.x_train, data.y_train, global_batch=32, seed=5)

# The pipeline is TensorFlow's: loaded here, before JAX.
import tensorflow as tf  # noqa: E402, F401

tf_order = [(x, y) for x, y in batches.dataset(start_epoch=1, epochs=2, skip=3).as_numpy_iterator()]

import jax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
calls = plan(
    steps_per_epoch=batches.steps_per_epoch, start_epoch=1, epochs=2, skip=3, steps_per_execution=4
)
feed = Feed(batches, calls, block_steps=4, batch_sharding=NamedSharding(mesh, P(None, "data")))
jax_order = []
for _, _, n in calls:
    xs, ys = feed.next(n)
    jax_order += [(np.asarray(xs)[i] / 255.0, np.asarray(ys)[i]) for i in range(n)]
feed.close()
print(
    json.dumps(
        {
            "n": [len(tf_order), len(jax_order)],
            "x": max(float(np.abs(a[0] - b[0]).max()) for a, b in zip(tf_order, jax_order)),
            "y": all(bool((a[1] == b[1]).all()) for a, b in zip(tf_order, jax_order)),
        }
    )
)
