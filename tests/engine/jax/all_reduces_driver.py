"""Run by tests/engine/jax/test_jax_step.py: ``python all_reduces_driver.py``. On 2 logical
CPU devices (TensorFlow blocked), ``mirrorfit.fit`` trains the MLP (Adam, global batch 32, 3
steps a call) over 1 and over 4 micro-batches; the first call's compiled program is read.
Prints one JSON line: per number of micro-batches, the all-reduces in it."""

import json
import re
import sys

sys.modules["tensorflow"] = None  # the JAX engine never imports it

import numpy as np  # noqa: E402

import mirrorfit  # noqa: E402

mirrorfit.setup(backend="jax", replicas=2)
import keras  # noqa: E402

from mirrorfit.engine.jax import keras_fit  # noqa: E402

compiled: list = []  # the text of each fit's first compiled call
_train = keras_fit.Runner.train


def train(self, block, steps):
    if getattr(self, "_read", None) is None:
        self._read = True
        self._train = self._train or self._build_train(block)
        frozen_values = getattr(self, "frozen_values", None)
        lowered = self._train.lower(self.state, block, frozen_values, np.int32(steps))
        compiled.append(lowered.compile().as_text())
    return _train(self, block, steps)


keras_fit.Runner.train = train
rng = np.random.default_rng(0)
x, y = rng.random((96, 28, 28), dtype=np.float32), rng.integers(0, 10, 96)
out = {}
for accum in (1, 4):
    keras.utils.set_random_seed(0)
    model = mirrorfit.models.mlp()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    mirrorfit.fit(
        model, x, y, batch_size=32, epochs=1, verbose=0, steps_per_execution=3, accum_steps=accum
    )
    out[accum] = len(re.findall(r" all-reduce(?:-start)?\(", compiled[-1]))
print(json.dumps(out))
