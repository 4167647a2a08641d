"""keras.io's GAN pattern in fp16: a model whose train_step steps an optimizer of its own (a
LossScaleOptimizer it built), compile()'s default optimizer never stepped, trained by
``mirrorfit.fit`` on TensorFlow. Prints JSON: whether fit returned, the own optimizer's
applied steps, whether the weights changed. (A hostile pass of e3acabe found fit raising
"every one of the 10 optimizer steps was skipped" here.)"""

from __future__ import annotations

import json

import numpy as np

import mirrorfit

mirrorfit.setup(backend="tensorflow", precision="fp16")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402


class OwnOptimizer(keras.Sequential):
    def compile(self, own, **kwargs):
        super().compile(**kwargs)
        self.own = own

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            scaled = self.own.scale_loss(loss)
        self.own.apply(tape.gradient(scaled, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


rng = np.random.default_rng(0)
x, y = rng.random((640, 28, 28), dtype=np.float32), rng.integers(0, 10, 640)
model = OwnOptimizer(
    [
        keras.Input((28, 28)),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax", dtype="float32"),
    ]
)
own = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
model.compile(own, loss="sparse_categorical_crossentropy")
before = model.layers[-1].kernel.numpy().copy()
try:
    mirrorfit.fit(model, x, y, batch_size=64, epochs=1, verbose=0)
    error = None
except Exception as e:  # noqa: BLE001 - reported to the test
    error = f"{type(e).__name__}: {e}"
print(
    json.dumps(
        {
            "error": error,
            "applied": int(own.iterations.numpy()),
            "changed": not np.allclose(before, model.layers[-1].kernel.numpy()),
        }
    )
)
