"""Run by tests/engine/jax/test_jax_step.py (through conftest.runs_by_replicas): ``python
lstm_runs_driver.py REPLICAS RUNS OUT``. On REPLICAS logical CPU devices, the JAX engine
(TensorFlow blocked) trains a small LSTM one epoch on 256 MNIST examples for each run of RUNS
(a JSON list of [name]), from seed 3, and saves its weights to OUT/NAME.npz. Prints one JSON
line: per run, its largest weight change."""

import json
import os
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"

import numpy as np  # noqa: E402

from mirrorfit.engine import jax as engine  # noqa: E402

replicas, runs, folder = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
placement = engine.build_distribution(engine.configure_devices(replicas=replicas))

import keras  # noqa: E402

import mirrorfit  # noqa: E402

data = mirrorfit.load_mnist(train_examples=256, download=False)


def lstm():
    inputs = keras.Input((28, 28))
    return keras.Model(
        inputs, keras.layers.Dense(10, activation="softmax")(keras.layers.LSTM(16)(inputs))
    )


out = {}
for (name,) in runs:
    engine.seed(3)
    trainer = mirrorfit.Trainer(
        strategy=placement,
        model=lstm,
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=32,
        steps_per_execution=4,
    )
    init = [w.copy() for w in trainer.model.get_weights()]
    trainer.fit(
        mirrorfit.train_batches(data.x_train, data.y_train, global_batch=32, seed=1), epochs=1
    )
    np.savez(f"{folder}/{name}.npz", *trainer.model.get_weights())
    changed = max(float(np.abs(a - b).max()) for a, b in zip(init, trainer.model.get_weights()))
    out[name] = {"changed": changed}
print(json.dumps(out))
