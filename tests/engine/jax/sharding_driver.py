"""Run by tests/engine/jax/test_jax_sharding.py in a fresh interpreter: ``python
sharding_driver.py REPLICAS OUT``. On REPLICAS logical CPU devices (TensorFlow blocked) it
trains the same compiled model through ``mirrorfit.fit`` under ``--shard`` none, optimizer
and all, with SGD, with Adam over 2 micro-batches and with AdamW (and metrics); saves each
run's weights to OUT/NAME.npz and prints one JSON line: each run's ``state_bytes_per_device``,
and for a wide MLP under each mode its bytes, the collectives of its compiled call and the
call's scratch memory (over 1 and 2 micro-batches)."""

import json
import os
import re
import sys

sys.modules["tensorflow"] = None  # the JAX engine never imports it
os.environ["KERAS_BACKEND"] = "jax"

import numpy as np  # noqa: E402

from mirrorfit.engine import jax as engine  # noqa: E402
from mirrorfit.engine.jax.placement import build_placement  # noqa: E402

replicas, out = int(sys.argv[1]), sys.argv[2]
setup = engine.configure_devices(replicas=replicas)

import keras  # noqa: E402

import mirrorfit  # noqa: E402
from mirrorfit.engine.jax import keras_fit  # noqa: E402
from mirrorfit.fitting.loop import runner_of  # noqa: E402
from mirrorfit.fitting.setup import Setup, use  # noqa: E402

compiled: list = []  # each fit's first compiled call
_train = keras_fit.Runner.train


def train(self, block, steps):
    if getattr(self, "_read", None) is None:
        self._read = True
        self._train = self._train or self._build_train(block)
        frozen_values = getattr(self, "frozen_values", None)
        compiled.append(
            self._train.lower(self.state, block, frozen_values, np.int32(steps)).compile()
        )
    return _train(self, block, steps)


keras_fit.Runner.train = train
MODES = ("none", "optimizer", "all")


def small():
    x = inputs = keras.Input((28, 28))
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(64, activation="relu")(x)  # 784 x 64: split
    x = keras.layers.Dense(64, activation="relu")(x)  # 64 x 64: split
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x))  # 640: whole


def wide():
    x = inputs = keras.Input((512,))
    for _ in range(8):
        x = keras.layers.Dense(512, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(16)(x))


def optimizer(name):
    return {"sgd": keras.optimizers.SGD(0.05), "adam": keras.optimizers.Adam(1e-3)}[name]


data = mirrorfit.load_mnist(train_examples=1024, download=False)
x, y = data.x_train.astype("float32") / 255, data.y_train
report: dict = {"runs": {}, "wide": {}}
for mode in MODES:
    use(Setup(backend="jax", devices=setup, placement=build_placement(setup, shard=mode)))
    for name, accum in (("sgd", 1), ("adam", 2)):
        engine.seed(7)
        model = small()
        model.compile(optimizer=optimizer(name), loss="sparse_categorical_crossentropy")
        mirrorfit.fit(
            model,
            x,
            y,
            batch_size=128,
            epochs=2,
            verbose=0,
            steps_per_execution=3,
            accum_steps=accum,
        )
        np.savez(f"{out}/{mode}-{name}.npz", *model.get_weights())
        report["runs"][f"{mode}-{name}"] = runner_of(model).state_bytes_per_device()

    # its own loss, optimizer (AdamW) and metrics, and a partial last batch
    engine.seed(7)
    model = small()
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    history = mirrorfit.fit(model, x, y, batch_size=96, epochs=2, verbose=0)  # 10 x 96 + 64
    np.savez(f"{out}/{mode}-adamw.npz", *model.get_weights())
    report["runs"][f"{mode}-adamw"] = history.history["loss"][-1]

    if replicas == 4:  # the wide MLP's state per device and the collectives of its step
        rng = np.random.default_rng(0)
        xw, yw = rng.normal(size=(96, 512)).astype("float32"), rng.integers(0, 16, 96)
        for accum in (2, 1):
            engine.seed(7)
            model = wide()
            model.compile(
                optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
            mirrorfit.fit(
                model,
                xw,
                yw,
                batch_size=32,
                epochs=1,
                verbose=0,
                steps_per_execution=3,
                accum_steps=accum,
            )
            text = compiled[-1].as_text()
            report["wide"][f"{mode}-k{accum}"] = {  # XLA's scratch memory per device
                "temp": compiled[-1].memory_analysis().temp_size_in_bytes,
                "all_gathers": len(re.findall(r" all-gather(?:-start)?\(", text)),
            }
            if accum == 1:
                continue
            reduces = re.findall(r"= (\(.*?\)|\S+) all-reduce(?:-start)?\(", text)
            report["wide"][mode] = {
                "bytes": runner_of(model).state_bytes_per_device(),
                "weights": sum(w.nbytes for w in model.get_weights()),
                "optimizer": sum(np.asarray(v.value).nbytes for v in model.optimizer.variables),
                "all_reduce_shapes": reduces,
                "reduce_scatters": len(re.findall(r" reduce-scatter\(", text)),
                "all_gathers": len(re.findall(r" all-gather(?:-start)?\(", text)),
            }
report["tensorflow"] = sys.modules.get("tensorflow") is not None
print(json.dumps(report))
