"""Run by tests/engine/jax/test_jax_step.py: ``python all_reduces_driver.py``. On 2 logical
CPU devices, the JAX engine (TensorFlow blocked) compiles the CNN's training call (3 steps,
Adam, global batch 32) over 1 and over 4 micro-batches. Prints one JSON line: per number of
micro-batches, the all-reduces in the compiled program."""

import json
import os
import re
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"

import numpy as np  # noqa: E402

from mirrorfit.engine import jax as engine  # noqa: E402

placement = engine.build_distribution(engine.configure_devices(replicas=2))

import jax  # noqa: E402
import keras  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import mirrorfit  # noqa: E402

out = {}
for accum in (1, 4):
    trainer = mirrorfit.Trainer(
        strategy=placement,
        model=mirrorfit.models.cnn,
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=32,
        accum_steps=accum,
    )
    runner = trainer.runner
    split = NamedSharding(placement.mesh, P(None, "data"))
    xs = jax.device_put(np.zeros((3, 32, 28, 28), np.uint8), split)
    ys = jax.device_put(np.zeros((3, 32), np.int32), split)
    text = runner._steps.train.lower(runner._state, xs, ys, np.int32(3)).compile().as_text()
    out[accum] = len(re.findall(r" all-reduce(?:-start)?\(", text))
print(json.dumps(out))
