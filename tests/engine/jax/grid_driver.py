"""A model (Dense 64 -> 512 -> 512 -> 10, SGD with momentum) built after
``mirrorfit.setup(backend="jax", replicas=4, model_parallel=MP, shard=SHARD)`` and trained 2
epochs by ``mirrorfit.fit`` (shuffled, 200 examples in batches of 32, the last one
partial): the largest share of each weight and optimizer slot one device holds after build and
after ``fit``, the weights, the history, ``mirrorfit.evaluate`` and ``mirrorfit.predict``
against Keras's own. MP=1 is the data-parallel reference; MP=3 tries what the mesh cannot be
(prints the messages). Run as ``python grid_driver.py MP FOLDER [SHARD]``; writes
FOLDER/grid-MP-SHARD.npz and prints JSON."""

from __future__ import annotations

import json
import sys

sys.modules["tensorflow"] = None  # the JAX engine never imports it

import numpy as np  # noqa: E402

import mirrorfit  # noqa: E402

MP, FOLDER = int(sys.argv[1]), sys.argv[2]
SHARD = sys.argv[3] if len(sys.argv) > 3 else "none"
if MP == 3:  # what the mesh cannot be: each refused in one line, then the run goes on
    refused = []
    for kwargs in ({"model_parallel": 3}, {"model_parallel": 0}):
        try:
            mirrorfit.setup(backend="jax", replicas=4, **kwargs)
        except ValueError as e:
            refused.append(str(e))
    print(json.dumps({"refused": refused}))
    sys.exit(0)
mirrorfit.setup(backend="jax", replicas=4, model_parallel=MP, shard=SHARD)
import keras  # noqa: E402


def shares(variables) -> dict:
    """The largest fraction of each variable one device holds."""
    return {
        v.path: max(s.data.size for s in v.value.addressable_shards) / v.value.size
        for v in variables
        if v.shape
    }


keras.utils.set_random_seed(0)
model = keras.Sequential(
    [
        keras.Input((64,)),
        keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(10),
    ]
)
built = shares(model.weights)
model.compile(
    keras.optimizers.SGD(0.05, momentum=0.9),
    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
rng = np.random.default_rng(0)
x = rng.normal(size=(200, 64)).astype("float32")
y = rng.integers(0, 10, 200)
history = mirrorfit.fit(model, x, y, batch_size=32, epochs=2, verbose=0)
ours = mirrorfit.predict(model, x[:37], batch_size=8, verbose=0)
print(
    json.dumps(
        {
            "built": built,
            "trained": shares(model.weights),
            "slots": shares(model.optimizer.variables),
            "history": history.history,
            "evaluate": mirrorfit.evaluate(model, x, y, batch_size=32, verbose=0),
            "keras_evaluate": model.evaluate(x, y, batch_size=32, verbose=0),
            "predict_apart": float(np.abs(ours - model.predict(x[:37], verbose=0)).max()),
            "sharding": model.__dict__["_mirrorfit_runner"][1].describe_sharding(),
        }
    )
)
np.savez(f"{FOLDER}/grid-{MP}-{SHARD}.npz", *model.get_weights())
