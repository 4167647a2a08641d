"""Run by tests/engine/jax/test_jax_step.py (through conftest.runs_by_replicas): ``python
step_runs_driver.py REPLICAS RUNS OUT``. On REPLICAS logical CPU devices, the JAX engine
(TensorFlow blocked) trains the MLP 2 epochs on 2,048 MNIST examples for each run of RUNS (a
JSON list of [name, optimizer, accumulation steps, steps per execution]), from seed 7, and
saves its weights to OUT/NAME.npz. Prints one JSON line: per run, its steps, traces, largest
weight change, last loss, and whether TensorFlow was imported."""

import json
import os
import sys

sys.modules["tensorflow"] = None  # the JAX engine never imports it
os.environ["KERAS_BACKEND"] = "jax"

import numpy as np  # noqa: E402

from mirrorfit.engine import jax as engine  # noqa: E402

replicas, runs, folder = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
placement = engine.build_distribution(engine.configure_devices(replicas=replicas))

import keras  # noqa: E402

import mirrorfit  # noqa: E402

data = mirrorfit.load_mnist(train_examples=2048, download=False)
results = {}
for name, optimizer, accum, spe in runs:
    engine.seed(7)
    opt = {"sgd": keras.optimizers.SGD(0.05), "adam": keras.optimizers.Adam(1e-3)}[optimizer]
    trainer = mirrorfit.Trainer(
        strategy=placement,
        model=mirrorfit.models.mlp,
        optimizer=opt,
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=128,
        steps_per_execution=spe,
        accum_steps=accum,
    )
    init = [w.copy() for w in trainer.model.get_weights()]
    history = trainer.fit(
        mirrorfit.train_batches(data.x_train, data.y_train, global_batch=128, seed=3), epochs=2
    )
    np.savez(f"{folder}/{name}.npz", *trainer.model.get_weights())
    changed = max(float(np.abs(a - b).max()) for a, b in zip(init, trainer.model.get_weights()))
    results[name] = {
        "steps": history.steps,
        "traced": trainer.tracing_count(),
        "changed": changed,
        "loss": history.epochs[-1]["loss"],
        "tensorflow": sys.modules.get("tensorflow") is not None,
    }
print(json.dumps(results))
