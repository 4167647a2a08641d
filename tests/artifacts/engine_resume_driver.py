"""``python engine_resume_driver.py BACKEND PRECISION EPOCHS DIR``: mirrorfit.fit of a small
compiled model with checkpoint_dir=DIR on BACKEND at PRECISION; prints JSON: {"refused":
the ValueError's line, or None}."""

from __future__ import annotations

import json
import sys

import numpy as np

import mirrorfit

BACKEND, PRECISION, EPOCHS, DIR = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
mirrorfit.setup(backend=BACKEND, precision=PRECISION)
import keras  # noqa: E402

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = np.arange(64) % 3
try:
    mirrorfit.fit(model, x, y, batch_size=16, epochs=EPOCHS, checkpoint_dir=DIR, verbose=0)
    refused = None
except ValueError as e:
    refused = str(e)
print(json.dumps({"refused": refused}))
