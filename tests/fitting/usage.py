"""How a Keras user calls mirrorfit.fit beyond the kinds of model: generators and PyDataset
read as Keras reads them, a model's own train_step (each backend's form), batch
callbacks that change the learning rate, evaluate at other batch sizes, and bad arguments.
Run as ``python usage.py BACKEND OUT.json`` in a fresh process (2 logical CPU devices)."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np

import mirrorfit

BACKEND, OUT = sys.argv[1], sys.argv[2]
mirrorfit.setup(backend=BACKEND, replicas=2)
import keras  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(192, 4)).astype("float32")
y = (x @ rng.normal(size=(4, 1))).astype("float32")
out: dict = {}


def mlp(cls=keras.Sequential, lr=0.05):
    keras.utils.set_random_seed(5)
    if cls is keras.Sequential:
        m = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)]
        )
    else:
        inputs = keras.Input((4,))
        m = cls(inputs, keras.layers.Dense(1)(keras.layers.Dense(4, activation="tanh")(inputs)))
    m.compile(optimizer=keras.optimizers.SGD(lr), loss="mse", metrics=["mae"])
    return m


def same(a, b, atol=1e-6):
    return all(np.allclose(p, q, rtol=0, atol=atol) for p, q in zip(a, b))


# An endless generator with steps_per_epoch: each epoch reads on (its targets count the batches).
def endless():
    i = 0
    while True:
        i += 1
        yield x[:32], np.full((32, 1), i, "float32")


seen = []


class Targets(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        seen.append(logs["loss"])


model = mlp()
mirrorfit.fit(
    model,
    endless(),
    steps_per_epoch=3,
    epochs=3,
    verbose=0,
    steps_per_execution=2,
    callbacks=[Targets()],
)
out["generator_epochs"] = len(seen)
out["generator_loss_grows"] = seen[0] < seen[1] < seen[2]  # targets 1-3, 4-6, 7-9


class Counted(keras.utils.PyDataset):
    def __init__(self):
        super().__init__()
        self.ends = 0

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return x[i * 64 : (i + 1) * 64], y[i * 64 : (i + 1) * 64]

    def on_epoch_end(self):
        self.ends += 1


data = Counted()
history = mirrorfit.fit(mlp(), data, epochs=3, verbose=0, validation_data=Counted())
out["pydataset_epoch_ends"] = data.ends
out["pydataset_val"] = "val_loss" in history.history


# A model's own train_step in keras-io's form for each backend (a GradientTape on TensorFlow,
# Keras's stateless train_step(state, data) on JAX): the same update as Keras's own step.
class OwnStep(keras.Model):
    if BACKEND == "tensorflow":

        def train_step(self, data):
            import tensorflow as tf

            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            for m in self.metrics:
                m.update_state(loss) if m.name == "loss" else m.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    else:

        def train_step(self, state, data):
            import jax

            trainable, non_trainable, optimizer, metrics = state
            x, y = data
            grad = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)
            (loss, (unscaled, y_pred, non_trainable, metrics)), grads = grad(
                trainable, non_trainable, metrics, x, y, None, True, optimizer
            )
            trainable, optimizer = self.optimizer.stateless_apply(optimizer, grads, trainable)
            logs, metrics = self._update_metrics_variables(metrics, unscaled, x, y, y_pred, None)
            return logs, (trainable, non_trainable, optimizer, metrics)


own, plain = mlp(OwnStep), mlp(keras.Model)
plain.set_weights(own.get_weights())
mirrorfit.fit(own, x, y, batch_size=32, epochs=2, verbose=0, shuffle=False)
mirrorfit.fit(plain, x, y, batch_size=32, epochs=2, verbose=0, shuffle=False)
out["own_step_same"] = same(own.get_weights(), plain.get_weights())
partial = mlp(OwnStep)
history = mirrorfit.fit(partial, x[:100], y[:100], batch_size=32, epochs=1, verbose=0)
out["own_step_partial"] = bool(np.isfinite(history.history["loss"][0]))


class OtherBackendsStep(keras.Model):  # the other backend's form of the override
    if BACKEND == "jax":

        def train_step(self, data):
            return {}

    else:

        def train_step(self, state, data):
            return {}, state


# Keras's own evaluate and predict after mirrorfit.fit, on a bool input (KerasHub's
# padding_mask): under the strategy Keras reduced the batch to a MEAN first, which failed.
tokens = keras.Input((6,), dtype="int32", name="tokens")
mask = keras.Input((6,), dtype="bool", name="padding_mask")
hidden = keras.layers.Embedding(20, 4)(tokens) * keras.ops.expand_dims(
    keras.ops.cast(mask, "float32"), -1
)
masked = keras.Model(
    [tokens, mask], keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(hidden))
)
masked.compile("adam", "mse")
rng = np.random.default_rng(3)
xm = {"tokens": rng.integers(0, 20, (64, 6)), "padding_mask": rng.random((64, 6)) > 0.2}
ym = rng.random((64, 1)).astype("float32")
mirrorfit.fit(masked, xm, ym, batch_size=32, verbose=0)
out["bool_input_evaluate"] = [
    float(masked.evaluate(xm, ym, batch_size=32, verbose=0)),
    float(mirrorfit.evaluate(masked, xm, ym, batch_size=32, verbose=0)),
]
out["bool_input_predict"] = list(masked.predict(xm, batch_size=32, verbose=0).shape)


# An unseeded random op in a layer (the VAE's Sampling as keras-io first wrote it): Keras's
# own fit trains it on TensorFlow (on main, mirrorfit failed: "tf.function only supports
# singleton tf.Variables"), and refuses it on JAX, as Keras's own fit does.
class Noise(keras.layers.Layer):
    def call(self, inputs, training=False):
        if training:
            return inputs + 0.01 * keras.random.normal(keras.ops.shape(inputs))
        return inputs


noisy = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), Noise(), keras.layers.Dense(1)])
noisy.compile("sgd", "mse")
try:
    history = mirrorfit.fit(noisy, x, y, batch_size=32, epochs=2, verbose=0)
    out["unseeded"] = bool(np.isfinite(history.history["loss"]).all())
except ValueError as e:
    out["unseeded"] = str(e)


# A batch callback that sets the rate to 0 after the first call: later calls leave the weights.
class StopLearning(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(self.model.get_weights())
        self.model.optimizer.learning_rate = 0.0


model, stop = mlp(), StopLearning()
initial = model.get_weights()
mirrorfit.fit(
    model, x, y, batch_size=32, epochs=2, verbose=0, steps_per_execution=2, callbacks=[stop]
)
out["batch_rate_moved_first"] = not same(initial, stop.weights[0], atol=0)
out["batch_rate_frozen_after"] = same(stop.weights[0], model.get_weights(), atol=0)
out["final_rate"] = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))

# evaluate at other batch sizes after a fit that validated at one.
model = mlp()
mirrorfit.fit(model, x, y, batch_size=64, epochs=1, verbose=0, validation_split=0.25)
out["evaluate"] = [mirrorfit.evaluate(model, x, y, batch_size=b, verbose=0) for b in (16, 32, 64)]
out["evaluate_keras"] = model.evaluate(x, y, verbose=0)


def classifier(loss="sparse_categorical_crossentropy"):
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    m.compile(optimizer="sgd", loss=loss)
    return m


def two_heads():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4)(inputs)
    m = keras.Model(
        inputs,
        {
            "digit": keras.layers.Dense(3, activation="softmax", name="digit")(hidden),
            "value": keras.layers.Dense(1, name="value")(hidden),
        },
    )
    m.compile(optimizer="sgd", loss={"digit": "sparse_categorical_crossentropy", "value": "mse"})
    return m


# Bad arguments: one line each, a ValueError.
labels = np.arange(len(x)) % 3
errors = {}
for name, call in {
    "uncompiled": lambda: mirrorfit.fit(
        keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]), x, y
    ),
    "odd_batch": lambda: mirrorfit.fit(mlp(), x, y, batch_size=33, verbose=0),
    "zero_steps": lambda: mirrorfit.fit(mlp(), x, y, steps_per_epoch=0, verbose=0),
    "not_callback": lambda: mirrorfit.fit(mlp(), x, y, verbose=0, callbacks=[print]),
    "float_epochs": lambda: mirrorfit.fit(mlp(), x, y, epochs=1.5, verbose=0),
    "other_backends_step": lambda: mirrorfit.fit(mlp(OtherBackendsStep), x, y, verbose=0),
    "strings": lambda: mirrorfit.fit(
        mlp(), np.array([["a"] * 4] * 8, dtype=object), y[:8], verbose=0
    ),
    # Keras's own loss takes label 7 of 3 classes as a loss of 0 on JAX
    "label_range": lambda: mirrorfit.fit(
        classifier(), x, labels + 4 * (labels == 2), batch_size=32, verbose=0
    ),
    "val_label_range": lambda: mirrorfit.fit(
        classifier(), x, labels, batch_size=32, verbose=0, validation_data=(x, labels - 1)
    ),
    "named_loss": lambda: mirrorfit.fit(
        classifier(keras.losses.SparseCategoricalCrossentropy(name="xent")),
        x,
        labels + 3,
        batch_size=32,
        verbose=0,
    ),
    "head_label_range": lambda: mirrorfit.fit(
        two_heads(), x, {"digit": labels + 1, "value": y}, verbose=0
    ),
    # a label Keras's loss skips is no error
    "ignored_class": lambda: mirrorfit.fit(
        classifier(keras.losses.SparseCategoricalCrossentropy(ignore_class=-1)),
        x,
        np.where(labels == 2, -1, labels),
        batch_size=32,
        verbose=0,
    ),
}.items():
    try:
        call()
        errors[name] = None
    except ValueError as e:
        errors[name] = str(e)
out["errors"] = errors

# A layer frozen after compile: evaluate runs on (as Keras's own), fit is refused until the
# next compile, which applies it (on 078ee79: a device_put traceback on JAX).
refrozen = mlp()
mirrorfit.fit(refrozen, x, y, verbose=0)
refrozen.layers[0].trainable = False
out["refrozen_evaluate"] = [
    mirrorfit.evaluate(refrozen, x, y, verbose=0),
    refrozen.evaluate(x, y, verbose=0),
]
out["refrozen_fit"] = []
for again in (  # the second and third got past a check of the runner's cache key
    lambda: mirrorfit.fit(refrozen, x, y, verbose=0),
    lambda: mirrorfit.fit(refrozen, x, y, verbose=0, accum_steps=2),
    lambda: (  # recompiled, but with the optimizer built for the old weights
        refrozen.compile(optimizer=refrozen.optimizer, loss="mse", metrics=["mae"]),
        mirrorfit.fit(refrozen, x, y, verbose=0),
    ),
):
    try:
        again()
        out["refrozen_fit"].append(None)
    except ValueError as e:
        out["refrozen_fit"].append(str(e))
refrozen.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
kept = np.asarray(refrozen.layers[0].kernel.value).copy()
mirrorfit.fit(refrozen, x, y, verbose=0)
out["refrozen_kept"] = bool(np.array_equal(kept, np.asarray(refrozen.layers[0].kernel.value)))
h = mirrorfit.fit(
    mlp(),
    x,
    y,
    epochs=np.int64(2),
    batch_size=np.int32(32),
    verbose=0,
    callbacks=keras.callbacks.History(),
)
out["numpy_ints_and_one_callback"] = len(h.history["loss"])


def padding_warnings(batch_size: int, **kwargs) -> list[str]:
    """The warnings of a fit of a model with BatchNormalization (the padding of a partial
    last batch reaches its statistics)."""
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8), keras.layers.BatchNormalization()]
    )
    model.compile("sgd", "mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = np.ones((150, 4), "float32")
        mirrorfit.fit(
            model, data, data[:, :1].repeat(8, 1), batch_size=batch_size, verbose=0, **kwargs
        )
    return [str(w.message) for w in caught if "partial batch" in str(w.message)]


out["padding_warned"] = padding_warnings(32)


class MeanSquares(keras.Sequential):
    """A compute_loss override in keras-io's style: it ignores sample_weight."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return keras.ops.mean((y - y_pred) ** 2)


own = MeanSquares([keras.Input((4,)), keras.layers.Dense(1)])
own.compile("sgd")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mirrorfit.fit(
        own, np.ones((150, 4), "float32"), np.ones((150, 1), "float32"), batch_size=32, verbose=0
    )
out["own_loss_warned"] = [str(w.message) for w in caught if "padded to" in str(w.message)]
out["padding_unwarned"] = padding_warnings(30) + padding_warnings(32, drop_remainder=True)

# validation_steps: the same first batches scored every epoch, as Keras's evaluate resets its
# iterator (on main: each epoch read on, a different part of the validation data each time)
scored = mlp()
xv, yv = rng.normal(size=(500, 4)).astype("float32"), rng.normal(size=(500, 1)).astype("float32")
h = mirrorfit.fit(
    scored,
    x,
    y,
    epochs=3,
    verbose=0,
    shuffle=False,
    validation_data=(xv, yv),
    validation_batch_size=50,
    validation_steps=3,
)
out["validation_steps"] = [
    h.history["val_loss"][-1],
    float(scored.evaluate(xv[:150], yv[:150], batch_size=50, verbose=0)[0]),
]
with open(OUT, "w") as f:
    json.dump(out, f)
