"""Run by tests/engine/jax/test_jax_sharding.py in a fresh interpreter: ``python
penalty_driver.py``. On 2 logical CPU devices, a compiled model whose loss is a gradient
penalty (the gradient of its output with respect to its input, differentiated again, as
WGAN-GP's) trains one epoch under --shard none and all, from the same weights; prints one
JSON line: per mode, how far each weight moved."""

import json
import os
import sys

sys.modules["tensorflow"] = None  # the JAX engine never imports it
os.environ["KERAS_BACKEND"] = "jax"

import numpy as np  # noqa: E402

from mirrorfit.engine import jax as engine  # noqa: E402
from mirrorfit.engine.jax.placement import build_placement  # noqa: E402

setup = engine.configure_devices(replicas=2)

import jax  # noqa: E402
import keras  # noqa: E402

import mirrorfit  # noqa: E402
from mirrorfit.fitting.setup import Setup, use  # noqa: E402


class Penalised(keras.Model):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        g = jax.grad(lambda xx: keras.ops.sum(self(xx, training=training)))(x)
        return keras.ops.mean(keras.ops.sum(g**2, axis=-1))


def build():
    inputs = keras.Input((32,))
    hidden = keras.layers.Dense(64, use_bias=False)(inputs)  # 2,048 values: split
    return Penalised(inputs, keras.layers.Dense(1, use_bias=False)(hidden))


x = np.random.default_rng(0).normal(size=(32, 32)).astype("float32")
y = np.zeros((32, 1), "float32")
report = {}
for mode in ("none", "all"):
    use(Setup(backend="jax", devices=setup, placement=build_placement(setup, shard=mode)))
    engine.seed(0)
    model = build()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    before = [np.asarray(w.value) for w in model.weights]
    mirrorfit.fit(model, x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    report[mode] = [
        np.abs(np.asarray(w.value) - b).max().item() for w, b in zip(model.weights, before)
    ]
print(json.dumps(report))
