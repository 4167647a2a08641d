"""Two Keras variables holding one array (``b.kernel.assign(a.kernel)`` leaves them so), then
``mirrorfit.fit`` on 4 replicas under ``shard=SHARD`` (``all``: the variables' own buffers are
the state): prints one JSON line, the losses. Run as ``python shared_array_driver.py SHARD`` by
tests/fitting/test_orders.py."""

from __future__ import annotations

import json
import sys

sys.modules["tensorflow"] = None  # the JAX engine never imports it

import numpy as np  # noqa: E402

import mirrorfit  # noqa: E402

mirrorfit.setup(backend="jax", replicas=4, shard=sys.argv[1])
import keras  # noqa: E402

keras.utils.set_random_seed(0)
first, second = keras.layers.Dense(64), keras.layers.Dense(64)
model = keras.Sequential([keras.Input((64,)), first, second, keras.layers.Dense(8)])
model.compile(keras.optimizers.Adam(1e-3), "mse")
second.kernel.assign(first.kernel)
same = second.kernel.value is first.kernel.value
x = np.random.default_rng(0).normal(size=(128, 64)).astype("float32")
history = mirrorfit.fit(model, x, x[:, :8], batch_size=32, epochs=2, verbose=0)
print(json.dumps({"same_object": same, "loss": history.history["loss"]}))
