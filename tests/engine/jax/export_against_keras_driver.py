"""Run by tests/engine/jax/test_jax_sharded_checkpoints.py: ``python
export_against_keras_driver.py SAVED_MODEL KERAS_FILE``. Both predict 8 random images (the
SavedModel through its serving signature, with TensorFlow). Prints one JSON line: their
largest difference, and the spread of the .keras file's predictions."""

import json
import sys

import numpy as np
import tensorflow as tf
import keras

saved_model, keras_file = sys.argv[1], sys.argv[2]
x = np.random.default_rng(0).random((8, 28, 28)).astype("float32")
served = tf.saved_model.load(saved_model)
p = served.signatures["serving_default"](images=tf.constant(x))["probabilities"]
want = keras.saving.load_model(keras_file).predict(x, verbose=0)
print(json.dumps({"diff": float(np.abs(p.numpy() - want).max()), "spread": float(want.std())}))
