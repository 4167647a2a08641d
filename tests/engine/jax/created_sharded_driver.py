"""A wide model (Dense 2048 x 2048, BatchNormalization, Adam) built after
``mirrorfit.setup(backend="jax", replicas=4, shard=SHARD)`` and trained 2 epochs by
``mirrorfit.fit``: the largest share of each weight one device holds, read from the arrays'
shards, after build, in callbacks during ``fit`` and after it; the largest bytes of live
arrays one device holds (JAX's own accounting); the weights; Keras's own ``predict``,
``evaluate``, ``save``/``load_model`` and ``load_weights`` on the result.
Run as ``python created_sharded_driver.py SHARD FOLDER``; prints the figures as JSON."""

from __future__ import annotations

import contextlib
import json
import sys

sys.modules["tensorflow"] = None  # the JAX engine never imports it

import numpy as np  # noqa: E402

import mirrorfit  # noqa: E402

SHARD, FOLDER = sys.argv[1], sys.argv[2]
mirrorfit.setup(backend="jax", replicas=4, shard=SHARD)
import keras  # noqa: E402
from device_bytes import most_live_bytes  # noqa: E402 (beside this file)


def share(variable) -> float:
    """The largest fraction of ``variable`` one device holds."""
    value = variable.value
    return max(s.data.size for s in value.addressable_shards) / value.size


def shares(variables) -> dict:
    return {v.path: share(v) for v in variables}


@contextlib.contextmanager
def whole_on_one_device(shapes: set):
    """Within it: a list of the arrays JAX made on one device alone with one of ``shapes``
    (a whole copy of a weight that is split), each as it was made by ``jax.device_put``,
    ``jnp.asarray`` or ``jnp.array`` (what Keras's assign and conversions call)."""
    import jax

    made: list = []

    def watched(fn):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            for leaf in jax.tree_util.tree_leaves(out):
                if (
                    isinstance(leaf, jax.Array)
                    and len(leaf.sharding.device_set) == 1
                    and tuple(leaf.shape) in shapes
                ):
                    made.append(tuple(leaf.shape))
            return out

        return call

    saved = jax.device_put, jax.numpy.asarray, jax.numpy.array
    jax.device_put, jax.numpy.asarray, jax.numpy.array = map(watched, saved)
    try:
        yield made
    finally:
        jax.device_put, jax.numpy.asarray, jax.numpy.array = saved


class Watch(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.seen: list = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(shares(self.model.weights))

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(shares(self.model.weights))


keras.utils.set_random_seed(0)
model = keras.Sequential(
    [
        keras.Input((256,)),
        keras.layers.Dense(2048, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(2048, activation="relu"),
        keras.layers.Dense(10),
    ]
)
built = shares(model.weights)
model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
rng = np.random.default_rng(0)
x = rng.random((512, 256), dtype=np.float32)
y = rng.integers(0, 10, 512)
watch = Watch()
history = mirrorfit.fit(model, x, y, batch_size=64, epochs=2, verbose=0, callbacks=[watch])
live = most_live_bytes()  # the model's variables and the state fit keeps for the next call
reported = model.__dict__["_mirrorfit_runner"][1].state_bytes_per_device()  # --metrics-out's
predicted = model.predict(x[:37], verbose=0)
model.save(f"{FOLDER}/model.keras")
model.save_weights(f"{FOLDER}/model.weights.h5")
split = {tuple(w.shape) for w in model.weights if share(w) < 1}
with whole_on_one_device(split) as whole_copies:  # while the weights load from the files
    model.load_weights(f"{FOLDER}/model.weights.h5")
    loaded = keras.models.load_model(f"{FOLDER}/model.keras")
# The same load as Keras alone makes it (the watch sees what mirrorfit spares)
Variable = sys.modules["keras.src.backend.jax.core"].JaxVariable
ours = Variable._convert_to_tensor
Variable._convert_to_tensor = getattr(Variable, "_keras_convert_to_tensor", ours)
with whole_on_one_device(split) as keras_copies:
    model.load_weights(f"{FOLDER}/model.weights.h5")
Variable._convert_to_tensor = ours
# A NumPy subclass (a masked array) goes through Keras's own conversion, as without mirrorfit
kernel = model.layers[0].kernel
held = np.asarray(kernel.value)
kernel.assign(np.ma.masked_array(held, mask=held > 0))
masked_apart = float(np.abs(np.asarray(kernel.value) - held).max())
out = {
    "built": built,
    "during": watch.seen,
    "after": shares(model.weights),
    "optimizer": shares(model.optimizer.variables),
    "after_load_weights": shares(model.weights),
    "whole_copies_while_loading": len(whole_copies),
    "keras_whole_copies_while_loading": len(keras_copies),
    "masked_apart": masked_apart,
    "most_live_bytes": live,
    "state_bytes_per_device": reported,
    "loss": history.history["loss"],
    "weights": [w.tolist() for w in model.get_weights()],
    "predict_apart": float(np.abs(mirrorfit.predict(model, x[:37], verbose=0) - predicted).max()),
    "evaluate": [
        model.evaluate(x, y, verbose=0),
        mirrorfit.evaluate(model, x, y, verbose=0),
    ],
    "loaded_apart": float(np.abs(loaded.predict(x[:37], verbose=0) - predicted).max()),
}
# An optimizer a slice cannot be updated with: a ValueError naming the argument and the flag
factored = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64)])
factored.compile(keras.optimizers.Adafactor(), "mse")
try:
    mirrorfit.fit(factored, x[:, :64], x[:, :64], verbose=0)
    out["factored"] = None
except ValueError as e:
    out["factored"] = str(e)
print(json.dumps(out))
