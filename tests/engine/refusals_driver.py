"""Run by tests/engine/test_controller.py: ``python refusals_driver.py BACKEND``. On 2 logical
CPU devices of the BACKEND engine (jax or tensorflow), what the Trainer API (and
mirrorfit.fit's sparse labels) refuse: labels and inputs of different lengths, labels past
the model's outputs, batches other than the global batch; and labels it must accept (a class
a sparse loss ignores, labels of a loss that indexes nothing). Prints one JSON line: per case,
its ValueError's message or "accepted"."""

import importlib
import json
import os
import sys

backend = sys.argv[1]
os.environ["KERAS_BACKEND"] = backend

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mirrorfit  # noqa: E402

engine = importlib.import_module(f"mirrorfit.engine.{backend}")
dist = engine.build_distribution(engine.configure_devices(replicas=2))
data = mirrorfit.load_mnist(train_examples=640, download=False)
x, y = data.x_train, data.y_train


def trainer(classes=10):
    return mirrorfit.Trainer(
        strategy=dist,
        optimizer=keras.optimizers.SGD(0.05),
        model=lambda: mirrorfit.models.mlp(num_classes=classes),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=64,
    )


def batches(labels=y, batch=64):
    return mirrorfit.train_batches(x, labels, global_batch=batch, seed=1)


def legit(loss, labels, classes=4):
    # labels a sparse categorical loss skips, or that index nothing (MSE, hinge): trained
    t = mirrorfit.Trainer(
        strategy=dist,
        optimizer=keras.optimizers.SGD(0.01),
        model=lambda: mirrorfit.models.mlp(num_classes=classes),
        loss=loss,
        global_batch=64,
    )
    t.fit(mirrorfit.train_batches(x, labels, global_batch=64, seed=1), epochs=1)
    t.evaluate((x[:100], labels[:100]))


t, t3 = trainer(), trainer(classes=3)
cases = {
    "ignore_255": lambda: legit(
        keras.losses.SparseCategoricalCrossentropy(ignore_class=255),
        np.where(y % 4 == 3, 255, y % 4).astype(np.uint8),
    ),
    "mse_ints": lambda: legit(
        lambda a, b: keras.ops.mean((keras.ops.cast(a, "float32")[:, None] - b) ** 2, axis=-1),
        y,
        classes=2,
    ),
    "hinge": lambda: legit(
        lambda a, b: keras.ops.mean(
            keras.ops.maximum(0.0, 1.0 - keras.ops.cast(a, "float32")[:, None] * b), axis=-1
        ),
        np.where(y % 2, 1, -1),
        classes=2,
    ),
    "evaluate": lambda: t.evaluate((x[:100], y[:99])),
    "validation": lambda: t.fit(batches(), epochs=1, validation=(x[:100], y[:99])),
    "eval_labels": lambda: t.evaluate((x[:100], np.full(100, 99))),
    "train_labels": lambda: t3.fit(batches(), epochs=1),
    "batch": lambda: t.fit(batches(batch=32), epochs=1),
    "lengths": lambda: batches(labels=y[:600]),
}
out = {}
for name, case in cases.items():
    try:
        case()
        out[name] = "accepted"
    except ValueError as e:
        out[name] = str(e)
print(json.dumps(out))
