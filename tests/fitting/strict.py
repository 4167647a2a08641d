"""``mirrorfit.fit``/``evaluate`` given what Keras's ``fit`` takes and what it should not: each
case trains (the result checked) or raises one ValueError line. Run as ``python strict.py
BACKEND OUT.json`` (2 logical CPU devices); OUT holds each case's message, or None."""

from __future__ import annotations

import json
import sys
import warnings

import ml_dtypes
import numpy as np

import mirrorfit

BACKEND, OUT = sys.argv[1], sys.argv[2]
mirrorfit.setup(backend=BACKEND, replicas=2)
import keras  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(96, 4)).astype("float32")
labels = rng.integers(0, 3, size=96)
kw = dict(batch_size=32, epochs=1, verbose=0, shuffle=False)
out: dict = {}


def classifier():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


class OwnLoss(keras.Model):
    """A model whose loss is its own (add_loss), compiled without one: y=None trains it."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, inputs):
        out = self.dense(inputs)
        self.add_loss(keras.ops.mean(keras.ops.square(out - 1.0)))
        return out


def weights_after(sample_weight):
    model = classifier()
    mirrorfit.fit(model, x, labels, sample_weight=sample_weight, **kw)
    return model.get_weights()


def own_loss():
    model = OwnLoss()
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    return mirrorfit.fit(model, x, None, epochs=3, batch_size=32, verbose=0).history["loss"]


def with_optimizer(optimizer):
    model = classifier()
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


def two_inputs():
    a, b = keras.Input((x.shape[1],), name="left"), keras.Input((x.shape[1],), name="right")
    out = keras.layers.Dense(3, activation="softmax")(keras.layers.Concatenate()([a, b]))
    model = keras.Model([a, b], out)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def ragged_dataset():
    import tensorflow as tf

    rows = tf.ragged.constant([[1.0, 2.0], [3.0], [4.0, 5.0, 6.0, 7.0], [8.0]])
    return tf.data.Dataset.from_tensor_slices((rows, [0, 1, 2, 0])).batch(2)


def batched_dataset():
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((x, labels)).batch(32)


rows = np.arange(len(x))[:, None]
cases = {
    "float64_sample_weight": lambda: weights_after(np.linspace(0.5, 1.5, 96)),
    "int_sample_weight": lambda: weights_after(np.ones(96, np.int64)),
    "evaluate_float64_sample_weight": lambda: mirrorfit.evaluate(
        classifier(), x, labels, sample_weight=np.ones(96), batch_size=32, verbose=0
    ),
    "x_none": lambda: mirrorfit.fit(classifier(), None, labels, **kw),
    "two_inputs_one_array": lambda: mirrorfit.fit(two_inputs(), x, labels, **kw),
    "one_input_two_arrays": lambda: mirrorfit.fit(classifier(), [x * 0, x], labels, **kw),
    "y_none_own_loss": own_loss,
    "y_none_compiled_loss": lambda: mirrorfit.fit(classifier(), x, None, **kw),
    "class_weight_absent_class": lambda: mirrorfit.fit(
        classifier(), x, labels, class_weight={0: 1.0, 1: 1.0, 2: 1.0, 7: 2.0}, **kw
    ),
    "class_weight_string_key": lambda: mirrorfit.fit(
        classifier(), x, labels, class_weight={"0": 1.0}, **kw
    ),
    "class_weight_fractional_key": lambda: mirrorfit.fit(
        classifier(), x, labels, class_weight={0.5: 1.0}, **kw
    ),
    # a string is truthy: "no" dropped the remainder without a word (a hostile pass, 3e2d8f1)
    "drop_remainder_string": lambda: mirrorfit.fit(
        classifier(), x, labels, drop_remainder="no", **kw
    ),
    "validation_split_above_1": lambda: mirrorfit.fit(
        classifier(), x, labels, validation_split=1.5, **kw
    ),
    # Keras's "only supported for tensors or NumPy arrays", no way round, on d90347f
    "validation_split_of_a_dataset": lambda: mirrorfit.fit(
        classifier(), batched_dataset(), validation_split=0.25, epochs=1, verbose=0
    ),
    "fractional_sparse_labels": lambda: mirrorfit.fit(classifier(), x, labels + 0.5, **kw),
    "nan_sparse_labels": lambda: mirrorfit.fit(
        classifier(), x, np.where(labels == 1, np.nan, labels), **kw
    ),
    "one_hot_for_sparse_loss": lambda: mirrorfit.fit(
        classifier(), x, np.eye(3, dtype="int32")[labels], **kw
    ),
    "evaluate_label_out_of_range": lambda: mirrorfit.evaluate(
        classifier(), x, labels * 7, batch_size=32, verbose=0
    ),
    "evaluate_input_shape": lambda: mirrorfit.evaluate(
        classifier(), x[:, :3], labels, batch_size=32, verbose=0
    ),
    "integral_float_labels": lambda: mirrorfit.fit(classifier(), x, labels.astype("float32"), **kw),
    "ragged_x": lambda: mirrorfit.fit(classifier(), ragged_dataset(), **kw),
    # a traceback ("Data cardinality is ambiguous", "Invalid dtype: str32"), or complex inputs
    # cast to their real part without a word, on d64421a
    "rows_differ": lambda: mirrorfit.fit(classifier(), x, labels[:90], **kw),
    "string_labels": lambda: mirrorfit.fit(classifier(), x, labels.astype(str), **kw),
    "complex_x": lambda: mirrorfit.fit(classifier(), x.astype("complex64"), labels, **kw),
    "evaluate_rows_differ": lambda: mirrorfit.evaluate(
        classifier(), x, labels, sample_weight=np.ones(95), batch_size=32, verbose=0
    ),
    "dict_of_other_names": lambda: mirrorfit.fit(classifier(), {"a": x}, labels, **kw),
    # Keras's "could not convert string to float: 'wrong'" on c48e21a
    "targets_dict_one_output": lambda: mirrorfit.fit(classifier(), x, {"wrong": labels}, **kw),
    "evaluate_y_none": lambda: mirrorfit.evaluate(classifier(), x, batch_size=32, verbose=0),
    # trained 4 steps into NaN weights, then DivergedError blaming the rate, on 5cdf61e
    "nan_x": lambda: mirrorfit.fit(classifier(), np.where(rows == 5, np.nan, x), labels, **kw),
    "inf_sample_weight": lambda: mirrorfit.fit(
        classifier(), x, labels, sample_weight=np.where(rows[:, 0] == 3, np.inf, 1.0), **kw
    ),
    # val_loss nan for every epoch, without a word, on 7266387
    "nan_validation_x": lambda: mirrorfit.fit(
        classifier(), x, labels, validation_data=(np.where(rows == 7, np.nan, x), labels), **kw
    ),
    "nan_in_validation_split": lambda: mirrorfit.fit(
        classifier(), np.where(rows == 90, np.nan, x), labels, validation_split=0.25, **kw
    ),
    "nan_x_allowed": lambda: mirrorfit.fit(
        classifier(), np.where(rows == 5, np.nan, x), labels, allow_nan=True, **kw
    ),
    "ema": lambda: mirrorfit.fit(
        with_optimizer(keras.optimizers.Adam(use_ema=True)), x, labels, **kw
    ),
    "keras_accumulation": lambda: mirrorfit.fit(
        with_optimizer(keras.optimizers.SGD(gradient_accumulation_steps=2)), x, labels, **kw
    ),
}
results: dict = {}
for name, call in cases.items():
    try:
        results[name] = call()
        out[name] = None
    except ValueError as e:
        out[name] = str(e)
out["float64_equals_float32"] = out["float64_sample_weight"] is None and all(
    np.array_equal(a, b)
    for a, b in zip(
        results["float64_sample_weight"],
        weights_after(np.linspace(0.5, 1.5, 96).astype("float32")),
    )
)
# a batch of 7 on 2 replicas: scored as 8 with a padding row of weight 0 (on main: refused)
odd = classifier()
out["odd_evaluate_batch"] = [
    mirrorfit.evaluate(odd, x, labels, batch_size=7, verbose=0),
    odd.evaluate(x, labels, batch_size=7, verbose=0),
]


def two_outputs():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4, activation="relu")(inputs)
    model = keras.Model(
        inputs,
        {
            "value": keras.layers.Dense(1, name="value")(hidden),
            "kind": keras.layers.Dense(3, activation="softmax", name="kind")(hidden),
        },
    )
    model.compile(
        optimizer="sgd",
        loss={"value": "mse", "kind": "sparse_categorical_crossentropy"},
        metrics={"value": ["mae"], "kind": ["accuracy"]},
    )
    return model


# evaluate's list in Keras's order (on main: the logs' order, o1_mae where o1_loss is), and
# targets as a list for dict outputs, as Keras takes them (on main: a TypeError)
targets = [labels.astype("float32")[:, None], labels]  # sorted keys: kind, value
both = two_outputs()
out["two_outputs_evaluate"] = [
    mirrorfit.evaluate(
        both, x, {"kind": targets[0], "value": targets[1]}, batch_size=32, verbose=0
    ),
    both.evaluate(x, {"kind": targets[0], "value": targets[1]}, batch_size=32, verbose=0),
    mirrorfit.evaluate(both, x, targets, batch_size=32, verbose=0),
    both.evaluate(x, targets, batch_size=32, verbose=0),
]


def list_outputs():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    value = keras.layers.Dense(1, name="value")(inputs)
    kind = keras.layers.Dense(3, activation="softmax", name="kind")(inputs)
    model = keras.Model(inputs, [value, kind])
    model.compile(optimizer="sgd", loss=["mse", "sparse_categorical_crossentropy"])
    return model


def one_loss_of_two():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    model = keras.Model(
        inputs,
        {
            "value": keras.layers.Dense(1, name="value")(inputs),
            "kind": keras.layers.Dense(3, activation="softmax", name="kind")(inputs),
        },
    )
    model.compile(optimizer="sgd", loss={"value": "mse"})  # "kind" trains no loss
    return model


# a review of 93ce16d: targets for the outputs that have a loss (Keras's fit trains them; that
# commit refused them), and targets keyed by a list of outputs' names (Keras trains them by
# name; mirrorfit failed with KeyError: 0 before): both train, the latter as the list does
listed = list_outputs()
mirrorfit.fit(listed, x, [targets[0], labels], **kw)
named = list_outputs()
mirrorfit.fit(named, x, {"kind": labels, "value": targets[0]}, **kw)
out["targets_dict_by_output_names_apart"] = max(
    float(np.abs(a - b).max()) for a, b in zip(named.get_weights(), listed.get_weights())
)
for name, call in {
    "targets_dict_one_loss": lambda: mirrorfit.fit(
        one_loss_of_two(), x, {"value": targets[0]}, **kw
    ),
    "nan_x_bfloat16": lambda: mirrorfit.fit(
        classifier(), np.where(rows == 5, np.nan, x).astype(ml_dtypes.bfloat16), labels, **kw
    ),
}.items():
    try:
        call()
        out[name] = None
    except ValueError as e:
        out[name] = str(e)
try:  # a dict of outputs given a key it lacks
    mirrorfit.fit(two_outputs(), x, {"kind": targets[0], "valeu": targets[1]}, **kw)
    out["targets_dict_other_keys"] = None
except ValueError as e:
    out["targets_dict_other_keys"] = str(e)


class LargestError(keras.metrics.Metric):
    """A running maximum: not a sum, so adding the replicas' changes is not one device's."""

    def __init__(self, name="largest_error", **kwargs):
        super().__init__(name=name, **kwargs)
        self.largest = self.add_variable(shape=(), initializer="zeros", name="largest")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.largest.assign(keras.ops.maximum(self.largest, keras.ops.max(1.0 - y_pred)))

    def result(self):
        return keras.ops.convert_to_tensor(self.largest)


watched = classifier()
watched.compile(
    optimizer="sgd",
    loss="sparse_categorical_crossentropy",
    metrics=[LargestError(), "accuracy"],
)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mirrorfit.fit(watched, x, labels, **kw)
out["own_metric_warnings"] = [str(w.message) for w in caught if "own" in str(w.message)]


# an activity regularizer: the padding of a partial evaluation batch enters its loss (said,
# as for training)
by_hand_in = keras.Input((4,))
penalised = keras.layers.Dense(1, activity_regularizer=keras.regularizers.L2(1e-2))(by_hand_in)
by_hand = keras.Model(by_hand_in, penalised)
by_hand.compile(optimizer="sgd", loss="mse")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mirrorfit.evaluate(by_hand, x[:90], labels[:90, None], batch_size=32, verbose=0)
out["evaluation_padding_warnings"] = [
    str(w.message) for w in caught if "partial batch" in str(w.message)
]
if out["y_none_own_loss"] is None:
    losses = results["y_none_own_loss"]
    out["own_loss_falls"] = losses[-1] < losses[0]
with open(OUT, "w") as f:
    json.dump(out, f)
