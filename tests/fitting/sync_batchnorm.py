"""A model with BatchNormalization (a convolution's, over batch x height x width, and a
Dense layer's), compiled with SGD, trained one epoch with ``shuffle=False`` on 100 examples in
global batches of 32 (the last one partial): by ``mirrorfit.fit`` on 2 replicas with
``sync_batchnorm`` (``synced``) or without (``per-replica``, the warning recorded), on one
replica (``one``), or by its own ``fit`` on one device (``keras``). Run as ``python
sync_batchnorm.py BACKEND MODE OUT``; writes OUT (JSON: weights, moving means and variances,
history, warnings)."""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np

import mirrorfit

BACKEND, MODE, OUT = sys.argv[1:4]
if MODE == "keras":
    os.environ["KERAS_BACKEND"] = BACKEND
else:  # "one": one replica, as Keras's own fit is (not synchronized)
    mirrorfit.setup(
        backend=BACKEND, replicas=1 if MODE == "one" else 2, sync_batchnorm=MODE == "synced"
    )
import keras  # noqa: E402
from keras import layers  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(1.0, 2.0, size=(100, 6, 6, 2)).astype("float32")
y = rng.integers(0, 3, size=100)
keras.utils.set_random_seed(3)
model = keras.Sequential(
    [
        keras.Input((6, 6, 2)),
        layers.Conv2D(4, 3),
        layers.BatchNormalization(momentum=0.5),
        layers.ReLU(),
        layers.Flatten(),
        layers.Dense(8),
        layers.BatchNormalization(momentum=0.5),
        layers.Dense(3, activation="softmax"),
    ]
)
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
fit = type(model).fit if MODE == "keras" else mirrorfit.fit
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    history = fit(model, x, y, batch_size=32, epochs=1, shuffle=False, verbose=0).history
norms = [layer for layer in model.layers if isinstance(layer, layers.BatchNormalization)]
out = {
    "weights": [w.tolist() for w in model.get_weights()],
    "moving_mean": [np.asarray(n.moving_mean).tolist() for n in norms],
    "moving_variance": [np.asarray(n.moving_variance).tolist() for n in norms],
    "loss": history["loss"],
    "warnings": [str(w.message) for w in caught],
}
if MODE == "synced":  # a BatchNormalization over a reshaped batch axis (rows = pixels)
    flat = keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            layers.Lambda(lambda t: keras.ops.reshape(t, (-1, 2)), output_shape=(2,)),
            layers.BatchNormalization(name="pixels"),
            layers.Lambda(lambda t: keras.ops.reshape(t, (-1, 72)), output_shape=(72,)),
            layers.Dense(3, activation="softmax"),
        ]
    )
    flat.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mirrorfit.fit(flat, x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    out["reshaped_warnings"] = [str(w.message) for w in caught if "'pixels'" in str(w.message)]
with open(OUT, "w") as f:
    json.dump(out, f)
