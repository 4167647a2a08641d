"""Run by tests/engine/tensorflow/test_parameter_server.py: ``python
atomic_increments_driver.py``. A Keras Mean metric and counter updated twice in a tf.function
under atomic_keras_increments(). Prints one JSON line: the metric's mean and count, the
counter, and whether keras.Variable's assign_add and assign_sub were restored after."""

import json

import keras
import tensorflow as tf

from mirrorfit.engine.tensorflow.parameter_server import atomic_keras_increments

metric, counter = keras.metrics.Mean(), keras.Variable(0, dtype="int64")
before = (keras.Variable.__dict__.get("assign_add"), keras.Variable.__dict__.get("assign_sub"))


@tf.function
def update(x):
    with atomic_keras_increments():
        metric.update_state(x)
        counter.assign_add(1)
        counter.assign_sub(3)


for _ in range(2):
    update(tf.constant([1.0, 2.0, 6.0]))
after = (keras.Variable.__dict__.get("assign_add"), keras.Variable.__dict__.get("assign_sub"))
print(
    json.dumps(
        {
            "mean": float(metric.result()),
            "count": float(metric.count.numpy()),
            "counter": int(counter.numpy()),
            "restored": before == after,
        }
    )
)
