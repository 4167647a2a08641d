"""Two edges of ``mirrorfit.fit`` on 2 replicas, as a user meets them. Run as ``python
edges_driver.py BACKEND DIR``; prints one JSON line.

* ``evaluate`` with a batch larger than the data (5 examples, batch 64: one partial batch,
  padded and masked) and with a partial last batch (1,001 examples, batch 64): loss and
  accuracy against the same figures computed here from the model's own ``predict``.
* Out of memory inside ``fit`` (a callback allocates 16 TiB, the framework's own error): the
  same error raised, with a note of what to try.
* BatchNormalization without ``sync_batchnorm``, one step of 64 rows whose halves (one per
  replica) differ: its moving statistics are the replicas' averaged (momentum 0.99 from 0 and
  1: 0.01 x the mean of the halves' means and variances), the same on every replica, and the
  model predicts in memory as it does saved and loaded.
* A model with a bfloat16 layer (its variables bfloat16, not only its compute) checkpointed by
  ``checkpoint_dir`` after 2 epochs, then resumed to 3: its weights against an uninterrupted
  3-epoch run, and their dtypes.
"""

import json
import sys
from pathlib import Path

import numpy as np

import mirrorfit

BACKEND, DIR = sys.argv[1], Path(sys.argv[2])
mirrorfit.setup(backend=BACKEND, replicas=2)
import keras  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(1001, 12)).astype("float32")
y = rng.integers(0, 4, 1001)
out: dict = {}


def build(bf16: bool = False):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(16, activation="relu", dtype="bfloat16" if bf16 else None),
            keras.layers.Dense(4, activation="softmax", dtype="float32"),
        ]
    )
    model.compile(
        keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def expected(model, n: int) -> list[float]:
    probs = np.asarray(model.predict(x[:n], batch_size=1024, verbose=0), np.float64)
    loss = float(np.mean(-np.log(probs[np.arange(n), y[:n]])))
    return [loss, float(np.mean(probs.argmax(1) == y[:n]))]


model = build()
mirrorfit.fit(model, x, y, batch_size=64, epochs=1, verbose=0)
for n in (5, 1001):
    got = mirrorfit.evaluate(model, x[:n], y[:n], batch_size=64, verbose=0)
    out[f"evaluate_{n}"] = {"got": [float(v) for v in got], "expected": expected(model, n)}


class Allocates(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if BACKEND == "jax":
            import jax.numpy as jnp

            jnp.zeros((1 << 42,), "float32").block_until_ready()
        else:
            import tensorflow as tf

            tf.zeros([1 << 42]).numpy()


try:
    mirrorfit.fit(model, x, y, batch_size=64, epochs=1, verbose=0, callbacks=[Allocates()])
    out["oom"] = None
except Exception as e:  # noqa: BLE001 - reported to the test
    out["oom"] = {"type": type(e).__name__, "notes": getattr(e, "__notes__", [])}

xb = x[:64].copy()
xb[32:] = 3 * xb[32:] + 2  # the second replica's half: another mean and variance
keras.utils.set_random_seed(1)
bn_model = keras.Sequential(
    [keras.Input((12,)), keras.layers.BatchNormalization(), keras.layers.Dense(4)]
)
bn_model.compile(keras.optimizers.SGD(0.05), loss="mse")
mirrorfit.fit(bn_model, xb, np.zeros((64, 4)), batch_size=64, epochs=1, shuffle=False, verbose=0)
bn = bn_model.layers[0]
halves = (xb[:32].astype(np.float64), xb[32:].astype(np.float64))


def copies(variable) -> list:
    value = variable.value
    if BACKEND == "tensorflow":
        return [
            np.asarray(c) for c in bn_model.distribute_strategy.experimental_local_results(value)
        ]
    return [np.asarray(shard.data) for shard in value.addressable_shards]


DIR.mkdir(parents=True, exist_ok=True)
bn_model.save(DIR / "bn.keras")
out["batchnorm"] = {
    "mean_off": float(
        np.abs(np.asarray(bn.moving_mean) - 0.01 * np.mean([h.mean(0) for h in halves], 0)).max()
    ),
    "variance_off": float(
        np.abs(
            np.asarray(bn.moving_variance) - (0.99 + 0.01 * np.mean([h.var(0) for h in halves], 0))
        ).max()
    ),
    "copies_apart": max(
        float(np.abs(c - copies(v)[0]).max())
        for v in (bn.moving_mean, bn.moving_variance)
        for c in copies(v)
    ),
    "saved_apart": float(
        np.abs(
            bn_model.predict(xb, verbose=0)
            - keras.saving.load_model(DIR / "bn.keras").predict(xb, verbose=0)
        ).max()
    ),
}

kw = dict(batch_size=64, shuffle=False, verbose=0)
whole = build(bf16=True)
mirrorfit.fit(whole, x, y, epochs=3, **kw)
mirrorfit.fit(build(bf16=True), x, y, epochs=2, checkpoint_dir=DIR / "ckpt", **kw)
resumed = build(bf16=True)
mirrorfit.fit(resumed, x, y, epochs=3, checkpoint_dir=DIR / "ckpt", **kw)
out["bf16"] = {
    "dtypes": [str(w.dtype) for w in resumed.weights],
    "max_diff": max(
        float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max())
        for a, b in zip(whole.get_weights(), resumed.get_weights())
    ),
    "epochs_trained": len(resumed.history.epoch),
}
print(json.dumps(out))
