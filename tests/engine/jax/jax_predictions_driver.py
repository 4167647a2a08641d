"""Run by tests/engine/jax/test_jax_checkpoints.py: ``python jax_predictions_driver.py KERAS_FILE``.
The .keras file predicts the first 8 MNIST test images on JAX, with TensorFlow blocked.
Prints one JSON line: the images and the predictions."""

import json
import os
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mirrorfit  # noqa: E402

x = mirrorfit.load_mnist(download=False).x_test[:8] / 255.0
model = keras.saving.load_model(sys.argv[1])
print(json.dumps({"x": x.tolist(), "p": np.asarray(model.predict(x, verbose=0)).tolist()}))
