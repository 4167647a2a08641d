"""``mirrorfit.predict`` on 2 replicas against the same model's own ``model.predict`` (one
program, the same weights): several outputs, a partial last batch, integer and bool inputs, a
model's own ``predict_step``, an unbuilt model, a ``tf.data`` input, callbacks, bad arguments.
Then Keras's own ``predict``/``evaluate``/``save``/``export`` after ``mirrorfit.fit`` on every
input dtype Keras takes. Run as ``python predicting.py BACKEND OUT.json`` in a fresh process
(2 logical CPU devices); writes OUT: the largest difference per case, shapes, messages."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np

import mirrorfit

BACKEND, OUT = sys.argv[1], sys.argv[2]
mirrorfit.setup(backend=BACKEND, replicas=2)
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(37, 6)).astype("float32")  # 37: a partial last batch, odd rows
out: dict = {"apart": {}, "shapes": {}}


def compare(name, model, inputs, **kwargs):
    ours = mirrorfit.predict(model, inputs, verbose=0, **kwargs)
    theirs = model.predict(inputs, verbose=0, **kwargs)
    pairs = zip(keras.tree.flatten(ours), keras.tree.flatten(theirs))
    out["apart"][name] = max(float(np.abs(a - b).max()) for a, b in pairs)
    out["shapes"][name] = [list(a.shape) for a in keras.tree.flatten(ours)]


keras.utils.set_random_seed(0)
inputs = keras.Input((6,))
hidden = keras.layers.Dense(8, activation="relu")(inputs)
two = keras.Model(inputs, [keras.layers.Dense(3)(hidden), keras.layers.Dense(1)(hidden)])
compare("two_outputs", two, x, batch_size=8)
compare("default_batch", two, x)
compare("steps", two, x, batch_size=8, steps=2)

tokens = keras.Input((5,), dtype="int32")
mask = keras.Input((5,), dtype="bool")
pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 4)(tokens), mask=mask)
masked = keras.Model([tokens, mask], keras.layers.Dense(2)(pooled))
xt, xm = rng.integers(0, 20, (11, 5)).astype("int32"), rng.random((11, 5)) > 0.3
compare("int_and_bool", masked, [xt, xm], batch_size=4)


class OwnStep(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, inputs):
        return self.dense(inputs)

    def predict_step(self, *args):  # each backend's signature
        result = super().predict_step(*args)
        if BACKEND == "jax":
            logits, non_trainable = result
            return {"logits": logits, "probs": keras.ops.softmax(logits)}, non_trainable
        return {"logits": result, "probs": keras.ops.softmax(result)}


own = OwnStep()
own(x[:1])
compare("own_predict_step", own, x, batch_size=8)
out["own_keys"] = sorted(mirrorfit.predict(own, x, verbose=0))


class Noisy(keras.layers.Layer):  # a seeded draw at inference: its state moves every batch
    def __init__(self):
        super().__init__()
        self.seed = keras.random.SeedGenerator(3)

    def call(self, inputs):
        return inputs + keras.random.normal(keras.ops.shape(inputs), seed=self.seed)


noisy = [keras.Sequential([keras.Input((6,)), Noisy()]) for _ in range(2)]
drawn = mirrorfit.predict(noisy[0], x[:32], batch_size=8, verbose=0)
out["apart"]["seeded_draws"] = float(np.abs(drawn - noisy[1].predict(x[:32], 8, verbose=0)).max())
out["seed_states"] = [[v.numpy().tolist() for v in m.non_trainable_variables] for m in noisy]
out["draws_differ"] = float(np.abs(drawn[:8] - drawn[8:16]).max())

unbuilt = keras.Sequential([keras.layers.Dense(4), keras.layers.BatchNormalization()])
compare("unbuilt", unbuilt, x)
compare("dataset", unbuilt, tf.data.Dataset.from_tensor_slices(x).batch(10))


class Batches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen: list = []

    def on_predict_batch_end(self, batch, logs=None):
        self.seen.append([batch, len(logs["outputs"])])


batches = Batches()
mirrorfit.predict(unbuilt, x, batch_size=16, callbacks=[batches], verbose=0)
out["callback_batches"] = batches.seen

unbuilt.run_eagerly = True  # not honoured (every step compiled): said, not ignored
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mirrorfit.predict(unbuilt, x, verbose=0)
unbuilt.run_eagerly = False
out["eager_warnings"] = [str(w.message) for w in caught if "run_eagerly" in str(w.message)]

out["errors"] = {}
for name, bad in {
    "zero_batch": {"batch_size": 0},
    "float_batch": {"batch_size": 2.5},
    "verbose": {"verbose": 3},
    "bool_steps": {"steps": True},
    "no_x": {"x": None},
    "not_model": {"model": object()},
    "not_callback": {"callbacks": ["abc"]},
    "ragged": {"x": tf.ragged.constant([[1.0] * 6, [2.0] * 5])},
}.items():
    arguments = {"model": unbuilt, "x": x, **bad}
    try:
        mirrorfit.predict(**arguments)
        out["errors"][name] = None
    except ValueError as e:
        out["errors"][name] = str(e)


@keras.saving.register_keras_serializable("predicting")
class AsFloat(keras.layers.Layer):
    def call(self, inputs):
        return keras.ops.cast(inputs, "float32")


# Keras's own calls after mirrorfit.fit, every input dtype Keras takes.
out["own_calls"] = {}
exported = {}
for dtype in ("float16", "float32", "float64", "int32", "int64", "uint8", "bool"):
    keras.utils.set_random_seed(1)
    tensor_in = keras.Input((4,), dtype=dtype)
    model = keras.Model(tensor_in, keras.layers.Dense(1)(AsFloat()(tensor_in)))
    model.compile(optimizer="sgd", loss="mse")
    data = (rng.random((64, 4)) * 4).astype(dtype)
    target = rng.random((64, 1)).astype("float32")
    mirrorfit.fit(model, data, target, batch_size=16, epochs=1, verbose=0)
    model.save(f"{OUT}.{dtype}.keras")
    model.export(f"{OUT}.{dtype}.export", verbose=False)
    predicted = model.predict(data, batch_size=16, verbose=0)
    loaded = keras.models.load_model(f"{OUT}.{dtype}.keras")
    exported[dtype] = (data, predicted)
    out["own_calls"][dtype] = {
        "evaluate": [
            float(model.evaluate(data, target, batch_size=16, verbose=0)),
            float(mirrorfit.evaluate(model, data, target, batch_size=16, verbose=0)),
        ],
        "predict_vs_ours": float(np.abs(predicted - mirrorfit.predict(model, data)).max()),
        "loaded_apart": float(np.abs(loaded.predict(data, verbose=0) - predicted).max()),
    }

# TensorFlow cannot call a SavedModel loaded while a MirroredStrategy is the default (its own
# behaviour, without mirrorfit too): the exports are loaded as a server would, with none.
tf.distribute.experimental_set_strategy(None)
for dtype, (data, predicted) in exported.items():
    artifact = tf.saved_model.load(f"{OUT}.{dtype}.export")  # held: its variables live with it
    try:
        served = np.asarray(artifact.serve(tf.constant(data)))
    except tf.errors.InvalidArgumentError as e:  # JAX 0.11's StableHLO, newer than TF 2.21's
        said = [line for line in str(e).splitlines() if "deserialize" in line] or [str(e)]
        out["own_calls"][dtype]["exported_apart"] = said[0].strip()[:300]
        continue
    out["own_calls"][dtype]["exported_apart"] = float(np.abs(served - predicted).max())
if BACKEND == "jax":
    import jax

    out["jax_version"] = [int(p) for p in jax.__version__.split(".")[:2]]

with open(OUT, "w") as f:
    json.dump(out, f)
