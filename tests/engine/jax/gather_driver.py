"""Run by tests/engine/jax/test_jax_sharding.py in a fresh interpreter: ``python
gather_driver.py``. On 2 logical CPU devices, models that take the layer-by-layer gather of
--shard all off its plain path train one epoch under --shard none and all, from the same
weights: a loss that is a gradient penalty (the gradient of the output with respect to the
input, differentiated again, as WGAN-GP's), a layer called in keras.ops.fori_loop, and one
called in keras.ops.cond. Prints one JSON line: per model and mode, how far each weight
moved."""

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


class Looped(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(32, activation="tanh")  # 1,024 values: split
        self.out = keras.layers.Dense(1, use_bias=False)

    def call(self, x):
        return self.out(keras.ops.fori_loop(0, 3, lambda i, h: self.hidden(h), x))


class Branched(Looped):
    def call(self, x):
        h = keras.ops.cond(keras.ops.sum(x) > 0, lambda: self.hidden(x), lambda: -self.hidden(x))
        return self.out(h)


def penalised():
    inputs = keras.Input((32,))
    hidden = keras.layers.Dense(64, use_bias=False)(inputs)  # 2,048 values: split
    return Penalised(inputs, keras.layers.Dense(1, use_bias=False)(hidden))


x = np.random.default_rng(0).normal(size=(32, 32)).astype("float32")
y = np.random.default_rng(1).normal(size=(32, 1)).astype("float32")
report = {}
for name, build in (("penalty", penalised), ("loop", Looped), ("branch", Branched)):
    for mode in ("none", "all"):
        use(Setup(backend="jax", devices=setup, placement=build_placement(setup, shard=mode)))
        engine.seed(0)
        model = build()
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        model(x[:2])  # built: its weights exist before the fit
        before = [np.asarray(w.value) for w in model.weights]
        mirrorfit.fit(model, x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
        report[f"{name}-{mode}"] = [
            np.abs(np.asarray(w.value) - b).max().item() for w, b in zip(model.weights, before)
        ]
print(json.dumps(report))
