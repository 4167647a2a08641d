"""Run by tests/engine/tensorflow/test_step.py: ``python accum_driver.py REPLICAS ACCUMS
OUT``. On REPLICAS logical CPU replicas (TensorFlow), trains the MLP 2 epochs on 2,048 MNIST
examples (global batch 128) once for each number of accumulated micro-batches in ACCUMS (a
JSON list), each afresh from seed 7, saving its weights to OUT/xREPLICAS_accumK.npz. Prints
one JSON line: per run, its steps, micro-batch, optimizer iterations and traces."""

import json
import sys

import keras
import numpy as np

import mirrorfit

replicas, accums, out = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
setup = mirrorfit.configure_devices(replicas=replicas)
strategy = mirrorfit.build_strategy(setup)
data = mirrorfit.load_mnist(train_examples=2048, download=False)
results = {}
for accum in accums:
    keras.utils.set_random_seed(7)
    trainer = mirrorfit.Trainer(
        strategy=strategy,
        model=mirrorfit.models.mlp,
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=128,
        steps_per_execution=4,
        accum_steps=accum,
    )
    history = trainer.fit(
        mirrorfit.train_batches(data.x_train, data.y_train, global_batch=128, seed=3), epochs=2
    )
    np.savez(f"{out}/x{replicas}_accum{accum}.npz", *trainer.model.get_weights())
    results[f"x{replicas}_accum{accum}"] = {
        "steps": history.steps,
        "micro": trainer.micro_batch,
        "iterations": int(trainer.optimizer.iterations.numpy()),
        "traced": trainer.tracing_count(),
    }
print(json.dumps(results))
