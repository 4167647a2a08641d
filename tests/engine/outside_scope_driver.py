"""Run by tests/engine/test_controller.py: ``python outside_scope_driver.py``. On 2 logical
CPU replicas (TensorFlow), a Trainer is given a model built outside strategy.scope(). Prints
one JSON line: its ConfigError's message (null: accepted)."""

import json

import keras

import mirrorfit

setup = mirrorfit.configure_devices(replicas=2)
strategy = mirrorfit.build_strategy(setup)
model = mirrorfit.models.mlp()  # built outside strategy.scope()
try:
    mirrorfit.Trainer(
        strategy=strategy,
        model=model,
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=64,
    )
    print(json.dumps({"error": None}))
except mirrorfit.ConfigError as e:
    print(json.dumps({"error": str(e)}))
