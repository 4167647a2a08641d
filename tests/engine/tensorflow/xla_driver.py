"""Run by tests/engine/tensorflow/test_step.py: ``python xla_driver.py MODEL XLA OUT``. On 2
logical CPU replicas, trains MODEL (module:function, e.g. mirrorfit.models:mlp) one epoch on
1,024 MNIST examples from seed 7, with jit_compile if XLA is ``true``, and saves its weights
to OUT.npz. Prints one JSON line: whether it ran under XLA, the trainer's notices and the
steps."""

import importlib
import json
import sys

import keras
import numpy as np

import mirrorfit

spec, xla, out = sys.argv[1], sys.argv[2] == "true", sys.argv[3]
setup = mirrorfit.configure_devices(replicas=2)
strategy = mirrorfit.build_strategy(setup)
data = mirrorfit.load_mnist(train_examples=1024, download=False)
keras.utils.set_random_seed(7)
notices = []
module, _, function = spec.partition(":")
trainer = mirrorfit.Trainer(
    strategy=strategy,
    model=getattr(importlib.import_module(module), function),
    optimizer=keras.optimizers.SGD(0.1),
    loss=keras.losses.SparseCategoricalCrossentropy(),
    global_batch=64,
    steps_per_execution=8,
    jit_compile=xla,
    on_notice=notices.append,
)
history = trainer.fit(
    mirrorfit.train_batches(data.x_train, data.y_train, global_batch=64, seed=3), epochs=1
)
np.savez(out, *trainer.model.get_weights())
print(json.dumps({"xla": trainer.jit_compile, "notices": notices, "steps": history.steps}))
