"""Run by tests/engine/test_controller.py (through conftest.runs_by_replicas): ``python
controller_runs_driver.py REPLICAS RUNS OUT``. On REPLICAS logical CPU devices (TensorFlow),
each run of RUNS (a JSON list of [name, strategy kind, optimizer, steps per execution]) builds
its strategy, the MLP and its optimizer afresh from seed 7, trains 2 epochs on 2,048 MNIST
examples, saves its weights to OUT/NAME.npz and evaluates 3,000 test examples. Prints one
JSON line: per run, its steps, traces, largest weight change, last epoch's loss and accuracy,
and the test result."""

import json
import sys

import keras
import numpy as np

import mirrorfit

replicas, runs, out = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
setup = mirrorfit.configure_devices(replicas=replicas)
data = mirrorfit.load_mnist(train_examples=2048, download=False)
results = {}
for name, kind, optimizer, spe in runs:
    strategy = mirrorfit.build_strategy(setup, kind=kind)
    keras.utils.set_random_seed(7)
    opt = {"sgd": keras.optimizers.SGD(0.05), "adam": keras.optimizers.Adam(1e-3)}[optimizer]
    trainer = mirrorfit.Trainer(
        strategy=strategy,
        model=mirrorfit.models.mlp,
        optimizer=opt,
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=64,
        steps_per_execution=spe,
    )
    init = [w.copy() for w in trainer.model.get_weights()]
    history = trainer.fit(
        mirrorfit.train_batches(data.x_train, data.y_train, global_batch=64, seed=3), epochs=2
    )
    np.savez(f"{out}/{name}.npz", *trainer.model.get_weights())
    changed = max(float(np.abs(a - b).max()) for a, b in zip(init, trainer.model.get_weights()))
    test = trainer.evaluate((data.x_test[:3000], data.y_test[:3000]), batch_size=64)
    results[name] = {
        "steps": history.steps,
        "traced": trainer.tracing_count(),
        "changed": changed,
        "loss": history.epochs[-1]["loss"],
        "accuracy": history.epochs[-1]["accuracy"],
        "test": test,
    }
print(json.dumps(results))
