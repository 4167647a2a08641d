"""Run by tests/engine/tensorflow/test_step.py: ``python fp16_overflow_driver.py``. On 2
logical CPU replicas, the MLP in fp16 takes one step on a batch whose second half (the second
replica's) overflows float16, then one on a good batch. Prints one JSON line: whether the bad
step left every weight as it was, the loss scale and skipped steps before and after, how much
the good step changed, and the layers' compute dtypes."""

import json

import numpy as np
import tensorflow as tf
import keras

import mirrorfit

setup = mirrorfit.configure_devices(replicas=2)
strategy = mirrorfit.build_strategy(setup)
keras.utils.set_random_seed(0)
trainer = mirrorfit.Trainer(
    strategy=strategy,
    model=mirrorfit.models.mlp,
    optimizer=keras.optimizers.SGD(0.1),
    loss=keras.losses.SparseCategoricalCrossentropy(),
    global_batch=64,
    precision="fp16",
)
rng = np.random.default_rng(0)
x = rng.uniform(0, 1, (64, 28, 28)).astype("float32")
y = rng.integers(0, 10, 64)
bad = x.copy()
bad[32:] = 3e4  # only the second replica's half overflows float16


def one_step(images):
    trainer.fit(tf.data.Dataset.from_tensor_slices((images, y)).batch(64), epochs=trainer.epoch + 1)


before = [w.copy() for w in trainer.model.get_weights()]
scale0 = trainer.loss_scale()
one_step(bad)
after_bad = trainer.model.get_weights()
state_bad = (trainer.loss_scale(), trainer.skipped_steps())
one_step(x)
changed = max(float(np.abs(a - b).max()) for a, b in zip(before, trainer.model.get_weights()))
print(
    json.dumps(
        {
            "unchanged": all(np.array_equal(a, b) for a, b in zip(before, after_bad)),
            "finite": all(bool(np.isfinite(w).all()) for w in trainer.model.get_weights()),
            "scale0": scale0,
            "scale_bad": state_bad[0],
            "skipped_bad": state_bad[1],
            "skipped_end": trainer.skipped_steps(),
            "changed_after_good": changed,
            "compute": trainer.model.layers[1].compute_dtype,
            "output": trainer.model.layers[-1].compute_dtype,
        }
    )
)
