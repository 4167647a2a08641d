"""Run by tests/engine/jax/test_jax_sharding.py in a fresh interpreter: ``python
sharding_driver.py REPLICAS OUT``. On REPLICAS logical CPU devices (TensorFlow blocked) it
trains the same model under ``--shard`` none, optimizer and all, with SGD and with Adam over
2 micro-batches, through mirrorfit's loop and through ``mirrorfit.fit`` (a compiled model);
saves each run's weights to OUT/NAME.npz and prints one JSON line: each run's
``state_bytes_per_device``, and for a wide MLP under each mode its bytes, the collectives
of its compiled step and the step's scratch memory (over 1 and 2 micro-batches)."""

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

import jax  # noqa: E402
import keras  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import mirrorfit  # noqa: E402
from mirrorfit.fitting.setup import Setup, use  # noqa: E402

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
report = {"runs": {}, "wide": {}}
for mode in MODES:
    placement = build_placement(setup, shard=mode)
    for name, accum in (("sgd", 1), ("adam", 2)):
        engine.seed(7)
        trainer = mirrorfit.Trainer(
            strategy=placement,
            model=small,
            optimizer=optimizer(name),
            loss=keras.losses.SparseCategoricalCrossentropy(),
            global_batch=128,
            steps_per_execution=3,
            accum_steps=accum,
        )
        trainer.fit(
            mirrorfit.train_batches(data.x_train, data.y_train, global_batch=128, seed=3), epochs=2
        )
        np.savez(f"{out}/loop-{mode}-{name}.npz", *trainer.model.get_weights())
        report["runs"][f"loop-{mode}-{name}"] = trainer.runner.state_bytes_per_device()

    # the compiled model's way in: its own loss, optimizer (AdamW) and metrics
    use(Setup(backend="jax", devices=setup, placement=placement))
    engine.seed(7)
    model = small()
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    history = mirrorfit.fit(
        model,
        data.x_train.astype("float32") / 255,
        data.y_train,
        batch_size=96,
        epochs=2,
        verbose=0,
    )  # 1024 = 10 x 96 + a partial
    np.savez(f"{out}/fit-{mode}.npz", *model.get_weights())
    report["runs"][f"fit-{mode}"] = history.history["loss"][-1]

    if replicas == 4:  # the wide MLP's state per device and the collectives of its step
        for accum in (2, 1):
            trainer = mirrorfit.Trainer(
                strategy=placement,
                model=wide,
                optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                global_batch=32,
                accum_steps=accum,
            )
            runner = trainer.runner
            split = NamedSharding(placement.mesh, P(None, "data"))
            xs = jax.device_put(np.zeros((3, 32, 512), np.float32), split)
            ys = jax.device_put(np.zeros((3, 32), np.int32), split)
            compiled = runner._steps.train.lower(runner._state, xs, ys, np.int32(3)).compile()
            text = compiled.as_text()
            report["wide"][f"{mode}-k{accum}"] = {  # XLA's scratch memory per device
                "temp": compiled.memory_analysis().temp_size_in_bytes,
                "all_gathers": len(re.findall(r" all-gather(?:-start)?\(", text)),
            }
            if accum == 1:
                continue
            reduces = re.findall(r"= (\(.*?\)|\S+) all-reduce(?:-start)?\(", text)
            report["wide"][mode] = {
                "bytes": runner.state_bytes_per_device(),
                "weights": sum(w.nbytes for w in runner.model.get_weights()),
                "optimizer": sum(np.asarray(v.value).nbytes for v in runner.optimizer.variables),
                "all_reduce_shapes": reduces,
                "reduce_scatters": len(re.findall(r" reduce-scatter\(", text)),
                "all_gathers": len(re.findall(r" all-gather(?:-start)?\(", text)),
            }
report["tensorflow"] = sys.modules.get("tensorflow") is not None
print(json.dumps(report))
