"""Run by tests/engine/jax/test_jax_train.py: ``python predict_driver.py A B``. Both .keras
files predict the first 1,000 MNIST test images, on JAX with TensorFlow blocked. Prints one
JSON line: their largest difference, and the spread of A's predictions."""

import json
import os
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mirrorfit  # noqa: E402

x = mirrorfit.load_mnist(download=False).x_test[:1000] / 255.0
a, b = (keras.saving.load_model(p).predict(x, verbose=0) for p in sys.argv[1:3])
print(json.dumps({"max_diff": float(np.abs(a - b).max()), "spread": float(a.std())}))
