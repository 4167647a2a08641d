"""Each kind of Keras model a user writes, trained from the same seeded initial weights with
shuffle=False, by ``mirrorfit.fit`` on 2 replicas (``mirrorfit``) or by the model's own
``model.fit`` on one device (``keras``). Run as ``python kinds.py BACKEND MODE OUT`` in a fresh
process; writes OUT.json (per kind: the history and an evaluation, or the error) and OUT.npz
(per kind: the trained weights)."""

from __future__ import annotations

import json
import sys

import numpy as np

import mirrorfit

BACKEND, MODE, OUT = sys.argv[1:4]
if MODE == "mirrorfit":
    mirrorfit.setup(backend=BACKEND, replicas=2)
else:  # Keras alone, as a user runs it on one device
    import os

    os.environ["KERAS_BACKEND"] = BACKEND
import keras  # noqa: E402
from keras import layers, ops  # noqa: E402

rng = np.random.default_rng(0)
N = 200  # batch 32: 6 full batches and a partial one of 8 every epoch


def data_regression():
    x = rng.normal(size=(N, 8)).astype("float32")
    return x, (x @ rng.normal(size=(8, 1)) + 0.1).astype("float32")


def kind_regression():
    m = keras.Sequential([keras.Input((8,)), layers.Dense(16, activation="relu"), layers.Dense(1)])
    m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
    return m, data_regression(), {}


def kind_binary():
    x = rng.normal(size=(N, 6)).astype("float32")
    y = (x[:, :1] + x[:, 1:2] > 0).astype("float32")
    m = keras.Sequential(
        [
            keras.Input((6,)),
            layers.Dense(8, activation="tanh"),
            layers.Dense(1, activation="sigmoid"),
        ]
    )
    m.compile(
        optimizer="adam",
        loss="binary_crossentropy",
        metrics=["accuracy", keras.metrics.AUC(name="auc")],
    )
    return m, (x, y), {}


def kind_one_hot():
    x = rng.normal(size=(N, 6)).astype("float32")
    y = keras.utils.to_categorical(np.argmax(x[:, :3], axis=1), 3).astype("float32")
    m = keras.Sequential(
        [
            keras.Input((6,)),
            layers.Dense(8, activation="relu"),
            layers.Dense(3, activation="softmax"),
        ]
    )
    m.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.CategoricalCrossentropy(),
        metrics=["accuracy"],
    )
    return m, (x, y), {}


def kind_logits():
    x = rng.normal(size=(N, 6)).astype("float32")
    y = np.argmax(x[:, :4], axis=1).astype("int64")
    m = keras.Sequential([keras.Input((6,)), layers.Dense(8, activation="relu"), layers.Dense(4)])
    m.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    return m, (x, y), {}


def kind_xla():
    """Compiled with jit_compile=True: XLA on both sides (TensorFlow's auto is off on a CPU)."""
    m, data, extra = kind_logits()
    m.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
        jit_compile=True,
    )
    return m, data, extra


def kind_transformer():
    x = rng.integers(1, 50, size=(N, 12)).astype("int32")
    y = (x[:, 0] > 25).astype("int32")
    inputs = keras.Input((12,), dtype="int32")
    h = layers.Embedding(50, 16)(inputs)
    a = layers.MultiHeadAttention(num_heads=2, key_dim=8)(h, h)
    h = layers.LayerNormalization()(h + a)
    h = layers.GlobalAveragePooling1D()(h)
    m = keras.Model(inputs, layers.Dense(2, activation="softmax")(h))
    m.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return m, (x, y), {}


def kind_dict_two_outputs():
    a = rng.normal(size=(N, 4)).astype("float32")
    b = rng.normal(size=(N, 3)).astype("float32")
    left, right = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    h = layers.Dense(8, activation="relu")(layers.Concatenate()([left, right]))
    out_r = layers.Dense(1, name="value")(h)
    out_c = layers.Dense(1, activation="sigmoid", name="flag")(h)
    m = keras.Model({"a": left, "b": right}, {"value": out_r, "flag": out_c})
    m.compile(
        optimizer="adam",
        loss={"value": "mse", "flag": "binary_crossentropy"},
        loss_weights={"value": 1.0, "flag": 0.5},
        metrics={"value": ["mae"], "flag": ["accuracy"]},
    )
    y = {
        "value": (a.sum(1, keepdims=True) - b[:, :1]).astype("float32"),
        "flag": (a[:, :1] > 0).astype("float32"),
    }
    return m, ({"a": a, "b": b}, y), {}


def kind_autoencoder():
    x = rng.uniform(size=(N, 8, 8, 1)).astype("float32")
    m = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            layers.Conv2D(4, 3, padding="same", activation="relu"),
            layers.Conv2D(1, 3, padding="same", activation="sigmoid"),
        ]
    )
    m.compile(optimizer="adam", loss="binary_crossentropy")
    return m, (x, x), {}


def kind_rescaling_uint8():
    x = rng.integers(0, 256, size=(N, 8, 8, 1)).astype("uint8")
    y = (x.reshape(N, -1).mean(1) > 127.5).astype("int32")
    m = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            layers.Rescaling(1 / 255),
            layers.Conv2D(4, 3, activation="relu"),
            layers.Flatten(),
            layers.Dense(2, activation="softmax"),
        ]
    )
    m.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return m, (x, y), {}


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = layers.Dense(8, activation="relu"), layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))


def kind_subclassed():
    m = Subclassed()
    m.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return m, data_regression(), {}


class HuberByHand(keras.Model):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        error = ops.abs(y - y_pred)
        per_example = ops.mean(ops.where(error < 1.0, 0.5 * error**2, error - 0.5), axis=-1)
        if sample_weight is not None:
            per_example = per_example * ops.reshape(sample_weight, (-1,))
        weighted = per_example
        return ops.sum(weighted) / ops.cast(ops.shape(weighted)[0], "float32") + sum(self.losses)


def kind_compute_loss():
    inputs = keras.Input((8,))
    h = layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-3))(inputs)
    m = HuberByHand(inputs, layers.Dense(1)(h))
    m.compile(optimizer="adam", metrics=["mae"])
    return m, data_regression(), {}


class WeightPenalty(layers.Layer):
    """A Dense whose call adds a penalty on its own kernel (``add_loss``)."""

    def build(self, shape):
        self.kernel = self.add_weight(shape=(shape[-1], 4), initializer="glorot_uniform")

    def call(self, x):
        self.add_loss(1e-2 * ops.sum(ops.square(self.kernel)))
        return ops.matmul(x, self.kernel)


def kind_regularised():
    m = keras.Sequential(
        [
            keras.Input((8,)),
            layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-2)),
            WeightPenalty(),
            layers.Dense(1, bias_regularizer=keras.regularizers.L1(1e-2)),
        ]
    )
    m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
    return m, data_regression(), {}


def kind_sample_weights():
    m, (x, y), _ = kind_regression()
    return m, (x, y), {"sample_weight": rng.uniform(0.1, 2.0, size=(N,)).astype("float32")}


def kind_class_weights():
    m, (x, y), _ = kind_logits()
    return m, (x, y), {"class_weight": {0: 1.0, 1: 2.0, 2: 0.5, 3: 1.5}}


def kind_partial_batch():
    m, (x, y), _ = kind_regression()
    return m, (x[:100], y[:100]), {"batch_size": 64}  # 1 full batch, 1 of 36


def kind_masked_pooling():
    # mask_zero tokens averaged by a masked pooling: a row of only zeros would be 0/0 (the
    # padding of a partial batch once was: NaN), so the padding must be real rows
    x = rng.integers(1, 30, size=(N, 10)).astype("int32")
    x[:, 6:] = 0
    y = (x[:, 0] > 15).astype("int32")
    m = keras.Sequential(
        [
            keras.Input((10,), dtype="int32"),
            layers.Embedding(30, 8, mask_zero=True),
            layers.GlobalAveragePooling1D(),
            layers.Dense(2),
        ]
    )
    m.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return m, (x, y), {}


class KerasLossesInComputeLoss(keras.Model):
    """keras-io's Distiller's form: a compute_loss override calling Keras loss objects (on
    TensorFlow, each divides by the replicas; once, its loss was halved there)."""

    def __init__(self, inputs, outputs):
        super().__init__(inputs, outputs)
        self.hard = keras.losses.MeanSquaredError()
        self.soft = keras.losses.MeanAbsoluteError()

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return 0.7 * self.hard(y, y_pred, sample_weight) + 0.3 * self.soft(y, y_pred, sample_weight)


def kind_keras_losses_in_compute_loss():
    inputs = keras.Input((8,))
    h = layers.Dense(8, activation="relu")(inputs)
    m = KerasLossesInComputeLoss(inputs, layers.Dense(1)(h))
    m.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["mae"])
    return m, data_regression(), {}


class SuperTestStep(keras.Model):
    """A test_step that adds to Keras's own (on TensorFlow its loss once read x replicas)."""

    if BACKEND == "jax":

        def test_step(self, state, data):
            return super().test_step(state, data)

    else:

        def test_step(self, data):
            return super().test_step(data)


def kind_super_test_step():
    inputs = keras.Input((8,))
    m = SuperTestStep(inputs, layers.Dense(1)(layers.Dense(8, activation="relu")(inputs)))
    m.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return m, data_regression(), {"batch_size": 40}  # 5 whole batches: equal shares


def kind_clipnorm():
    # each gradient clipped to norm 0.05: on one device, the whole batch's gradient (Keras
    # clips each replica's under a strategy, before its all-reduce)
    m, data, _ = kind_regression()
    m.compile(optimizer=keras.optimizers.SGD(0.05, clipnorm=0.05), loss="mse", metrics=["mae"])
    return m, data, {}


def kind_global_clipnorm():
    m, data, _ = kind_regression()
    m.compile(optimizer=keras.optimizers.Adam(1e-2, global_clipnorm=0.1), loss="mse")
    return m, data, {}


class MeanOfSquares(keras.Model):
    """keras-io's compute_loss style: a mean of its own that ignores sample_weight, so the
    padding of a partial batch would enter it (padded once: 2e-2 off one device's weights)."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return ops.mean(ops.square(y - y_pred))


def kind_unweighted_compute_loss():
    inputs = keras.Input((8,))
    m = MeanOfSquares(inputs, layers.Dense(1)(layers.Dense(8, activation="relu")(inputs)))
    m.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["mae"])
    return m, data_regression(), {}


def kind_sum_reduction():
    # a sum over the batch: each replica's sum, averaged, was half of it (on both engines)
    m, data, _ = kind_regression()
    loss = keras.losses.MeanSquaredError(reduction="sum")
    m.compile(optimizer=keras.optimizers.SGD(1e-3), loss=loss, metrics=["mae"])
    return m, data, {}


def kind_mean_with_sample_weight():
    m, (x, y), _ = kind_regression()
    loss = keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")
    m.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss, metrics=["mae"])
    return m, (x, y), {"sample_weight": rng.uniform(0.1, 2.0, size=(N,)).astype("float32")}


def kind_lstm():
    """An RNN: its zero initial state is alike on every device, its scan's carry is not (under
    shard_map's replication check the step once failed to trace)."""
    x = rng.normal(size=(N, 6, 3)).astype("float32")
    y = (x[:, :, 0].sum(1) > 0).astype("int32")
    m = keras.Sequential(
        [keras.Input((6, 3)), layers.LSTM(8), layers.Dense(2, activation="softmax")]
    )
    m.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return m, (x, y), {}


def kind_accumulated():
    """4 micro-batches per optimizer step on each replica: the step of the whole batch."""
    m, data, _ = kind_logits()
    return m, data, {"mirrorfit": {"accum_steps": 4}}


def kind_steps_per_execution():
    """5 steps in one compiled call (the epoch's 7 end in a shorter call): one step a call."""
    m, data, _ = kind_regression()
    return m, data, {"mirrorfit": {"steps_per_execution": 5}}


KINDS = {name[5:]: fn for name, fn in sorted(globals().items()) if name.startswith("kind_")}


def train(kind: str) -> tuple[dict, list]:
    keras.utils.set_random_seed(1)
    model, (x, y), extra = KINDS[kind]()
    batch = extra.pop("batch_size", 32)
    ours = extra.pop("mirrorfit", {})  # mirrorfit's settings alone: Keras's fit is the reference
    common = dict(batch_size=batch, epochs=3, shuffle=False, verbose=0, **extra)
    weights = {k: v for k, v in extra.items() if k == "sample_weight"}
    if MODE == "mirrorfit":
        history = mirrorfit.fit(model, x, y, validation_data=(x, y), **common, **ours).history
        evaluated = mirrorfit.evaluate(
            model, x, y, batch_size=batch, verbose=0, return_dict=True, **weights
        )
    else:
        history = model.fit(x, y, validation_data=(x, y), **common).history
        evaluated = model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True, **weights)
    if MODE == "mirrorfit":  # what the step was compiled with (JAX: every step, with XLA)
        xla = getattr(mirrorfit.fitting.loop.runner_of(model), "jit_compile", True)
    else:
        xla = model.jit_compile
    return {"history": history, "evaluate": evaluated, "xla": bool(xla)}, model.get_weights()


results, arrays = {}, {}
for kind in KINDS:
    try:
        results[kind], trained = train(kind)
        arrays.update({f"{kind}/{i}": w for i, w in enumerate(trained)})
    except Exception as e:  # noqa: BLE001 - reported per kind
        import traceback

        results[kind] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
np.savez(OUT + ".npz", **arrays)
with open(OUT + ".json", "w") as f:
    json.dump(results, f)
