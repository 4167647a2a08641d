"""A model with frozen weights (a LoRA Dense 1024 x 2048 whose kernel is frozen, a Dense
frozen by ``trainable = False``), batch norm and dropout, built after ``mirrorfit.setup(
backend="jax", replicas=4, shard=SHARD)`` and trained 2 epochs by ``mirrorfit.fit`` (SGD):
which non-trainable variables the engine finds frozen, the largest share of each frozen
weight one device holds (after build, in callbacks during ``fit``, after it), the largest
bytes of live arrays one device holds, the weights, and whether the frozen ones changed.
Run as ``python frozen_driver.py SHARD``; prints the figures as JSON."""

from __future__ import annotations

import json
import sys

sys.modules["tensorflow"] = None  # the JAX engine never imports it

import numpy as np  # noqa: E402

import mirrorfit  # noqa: E402

SHARD = sys.argv[1]
mirrorfit.setup(backend="jax", replicas=4, shard=SHARD)
import keras  # noqa: E402
from device_bytes import most_live_bytes  # noqa: E402 (beside this file)

from mirrorfit.engine.jax import keras_fit  # noqa: E402

try:
    from mirrorfit.engine.jax.keras_fit import frozen
except ImportError:  # before the engine told them apart

    def frozen(model, sample, replicas):
        return [False] * len(model.non_trainable_variables)


step_bytes: list = []  # what the compiled call's temporaries take on a device (XLA's count)
_train = keras_fit.Runner.train


def train(self, block, steps):
    if not step_bytes:
        self._train = self._train or self._build_train(block)
        frozen_values = getattr(self, "frozen_values", None)
        lowered = self._train.lower(self.state, block, frozen_values, np.int32(steps))
        step_bytes.append(lowered.compile().memory_analysis().temp_size_in_bytes)
    return _train(self, block, steps)


keras_fit.Runner.train = train

FROZEN = {"lora/kernel", "frozen/kernel", "frozen/bias"} | {f"lora{i}/kernel" for i in range(4)}


def share(variable) -> float:
    value = variable.value
    return max(s.data.size for s in value.addressable_shards) / value.size


def frozen_shares(model) -> dict:
    return {v.path: share(v) for v in model.weights if v.path in FROZEN}


class Watch(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.seen: list = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(frozen_shares(self.model))

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(frozen_shares(self.model))


keras.utils.set_random_seed(0)
inputs = keras.Input((256,))
h = keras.layers.Dense(1024, activation="relu", name="first")(inputs)
for i in range(4):
    h = keras.layers.Dense(1024, activation="relu", name=f"lora{i}")(h)
h = keras.layers.Dense(2048, name="lora")(h)
h = keras.layers.BatchNormalization(name="norm")(h)
h = keras.layers.Dropout(0.1, name="drop")(h)
h = keras.layers.Dense(512, activation="relu", name="frozen")(h)
outputs = keras.layers.Dense(10, name="head")(h)
model = keras.Model(inputs, outputs)
for name in ("lora0", "lora1", "lora2", "lora3", "lora"):
    model.get_layer(name).enable_lora(4)
model.get_layer("frozen").trainable = False
model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy")
rng = np.random.default_rng(0)
x = rng.random((512, 256), dtype=np.float32)
y = rng.integers(0, 10, 512)
found = frozen(model, x[:64], 4)
built = frozen_shares(model)
before = {v.path: np.asarray(v.value).copy() for v in model.weights if v.path in FROZEN}
watch = Watch()
history = mirrorfit.fit(
    model, x, y, batch_size=64, epochs=2, verbose=0, callbacks=[watch], steps_per_execution=4
)
live = most_live_bytes()
reported = model.__dict__["_mirrorfit_runner"][1].state_bytes_per_device()
out = {
    "frozen": {v.path: f for v, f in zip(model.non_trainable_variables, found)},
    "built": built,
    "during": watch.seen,
    "after": frozen_shares(model),
    "unchanged": all(
        np.array_equal(before[v.path], np.asarray(v.value))
        for v in model.weights
        if v.path in FROZEN
    ),
    "most_live_bytes": live,
    "step_temp_bytes": step_bytes[0],
    "frozen_bytes": sum(int(np.prod(v.shape)) * 4 for v in model.weights if v.path in FROZEN),
    "state_bytes_per_device": reported,
    "loss": history.history["loss"],
    "weights": [w.tolist() for w in model.get_weights()],
    "evaluate": mirrorfit.evaluate(model, x, y, verbose=0),
    "keras_evaluate": model.evaluate(x, y, verbose=0),
}
print(json.dumps(out))
