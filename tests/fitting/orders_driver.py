"""Shuffled data read in Keras's orders on JAX: each source below trained 3 epochs from the same
seeded weights by ``mirrorfit.fit`` on 2 replicas (MODE ``mirrorfit``) or by the model's own
``fit`` on one device (``keras``): arrays, a reshuffling tf.data pipeline, a PyDataset, and
arrays into a model with its own ``train_step`` (the runner over the global batch). Run as
``python orders_driver.py MODE jax`` (the engine named, as the suite's fork server reads
argv); prints one JSON line: each source's losses, or its error. Run by
tests/fitting/test_orders.py."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

MODE = sys.argv[1]
if MODE == "mirrorfit":
    import mirrorfit

    mirrorfit.setup(backend="jax", replicas=2)
else:
    os.environ["KERAS_BACKEND"] = "jax"
import keras  # noqa: E402

rng = np.random.default_rng(1)
x = rng.normal(size=(80, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 2))).astype("float32")


class OwnStep(keras.Sequential):
    """Keras's own train_step, overridden as a user does (calls super)."""

    def train_step(self, *args, **kwargs):
        return super().train_step(*args, **kwargs)


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 5

    def __getitem__(self, i):
        return x[i * 16 : (i + 1) * 16], y[i * 16 : (i + 1) * 16]


def source(name: str):
    if name == "tf.data":
        import tensorflow as tf

        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(80, seed=3).batch(16)
        return (data,), {}
    if name == "pydataset":
        return (Batches(),), {"shuffle": True}
    return (x, y), {"batch_size": 16, "shuffle": True}


losses = {}
for name in ("arrays", "tf.data", "pydataset", "own_train_step"):
    keras.utils.set_random_seed(0)
    kind = OwnStep if name == "own_train_step" else keras.Sequential
    model = kind(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    args, kwargs = source(name)
    fit = (lambda *a, m=model, **k: mirrorfit.fit(m, *a, **k)) if MODE == "mirrorfit" else model.fit
    try:
        losses[name] = fit(*args, epochs=3, verbose=0, **kwargs).history["loss"]
    except Exception as e:  # noqa: BLE001 - reported per source
        losses[name] = f"{type(e).__name__}: {e}"
print(json.dumps(losses))
