"""fp16 loss scaling on 2 TensorFlow replicas through ``mirrorfit.fit``: one call of two steps,
the first on a batch whose second half (the second replica's share) overflows float16 in its
loss-scaled gradients, the second on a good batch; beside it, the same model trained on the
good batch alone. Each replica computes its own gradients: without one agreement over them,
the first replica would apply a step the second skips, and the copies would part. Prints one
JSON line: the loss scale and applied steps, whether the replicas' copies agree, how far the
weights are from the good step alone, and the layers' compute dtypes. (JAX runs the global
batch as one program: one check sees every gradient.) Also whether a rerun in the same
process (a notebook's cell run again) resumes the fp16 checkpoint its first run wrote."""

import json
import tempfile

import numpy as np

import mirrorfit

mirrorfit.setup(backend="tensorflow", replicas=2, precision="fp16")
import keras  # noqa: E402


def build():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax", dtype="float32"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


rng = np.random.default_rng(0)
x = rng.uniform(0, 1, (64, 28, 28)).astype("float32")
y = rng.integers(0, 10, 64)
# Only the second replica's half overflows: its forward pass stays finite in float16 (the loss
# too), its loss-scaled gradients do not (the first kernel's sum 32 rows of 100 x ~1e3).
bad = x.copy()
bad[32:] = 100.0
kw = dict(batch_size=64, epochs=1, shuffle=False, verbose=0)
model, alone = build(), build()
mirrorfit.fit(model, np.concatenate([bad, x]), np.concatenate([y, y]), **kw)
mirrorfit.fit(alone, x, y, **kw)
optimizer, start = model.optimizer, build().get_weights()
# A notebook's rerun: the same cell builds and compiles again in the same process (Keras names
# the new optimizer sgd_1, and the LossScaleOptimizer's config holds that name), then resumes.
with tempfile.TemporaryDirectory() as folder:
    mirrorfit.fit(build(), x, y, checkpoint_dir=folder, **kw)
    try:
        mirrorfit.fit(build(), x, y, checkpoint_dir=folder, **{**kw, "epochs": 2})
        rerun_refused = None
    except ValueError as e:
        rerun_refused = str(e)
copies = [
    [np.asarray(c) for c in model.distribute_strategy.experimental_local_results(w.value)]
    for w in model.weights
]
print(
    json.dumps(
        {
            "rerun_refused": rerun_refused,
            "initial_scale": float(optimizer.initial_scale),
            "scale": float(optimizer.dynamic_scale.numpy()),
            "applied": int(optimizer.iterations.numpy()),
            "replicas_agree": all(np.array_equal(c[0], c[1]) for c in copies),
            "finite": all(bool(np.isfinite(w).all()) for w in model.get_weights()),
            "from_good_alone": max(
                float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), alone.get_weights())
            ),
            "moved": max(float(np.abs(a - b).max()) for a, b in zip(start, alone.get_weights())),
            "compute": model.layers[0].compute_dtype,
            "output": model.layers[-1].compute_dtype,
        }
    )
)
