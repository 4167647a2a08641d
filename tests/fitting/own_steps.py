"""keras-io's VAE (its own train_step, three trackers whose logs it renames, a SeedGenerator
drawing in a Sampling layer), in each backend's form, trained on 1,024 MNIST images by
``mirrorfit.fit`` on 2 replicas (``mirrorfit``) or by its own ``fit`` on one device
(``keras``). Run as ``python own_steps.py BACKEND MODE OUT`` in a fresh process; writes OUT
(JSON: the history, the weights' sums)."""

from __future__ import annotations

import json
import os
import sys

import mirrorfit

BACKEND, MODE, OUT = sys.argv[1:4]
if MODE == "mirrorfit":
    mirrorfit.setup(backend=BACKEND, replicas=2)
else:
    os.environ["KERAS_BACKEND"] = BACKEND
import keras  # noqa: E402
from keras import layers, ops  # noqa: E402


class Sampling(layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        epsilon = keras.random.normal(shape=ops.shape(z_mean), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


def losses(x, z_mean, z_log_var, reconstruction):
    rec = ops.mean(ops.sum(keras.losses.binary_crossentropy(x, reconstruction), axis=1))
    kl = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
    kl = ops.mean(ops.sum(kl, axis=1))
    return rec + kl, rec, kl


class VAE(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = layers.Dense(32, activation="relu")
        self.mean, self.log_var = layers.Dense(2), layers.Dense(2)
        self.sampling = Sampling()
        self.up = layers.Dense(32, activation="relu")
        self.out = layers.Dense(28 * 28, activation="sigmoid")
        self.total_tracker = keras.metrics.Mean(name="total_loss")
        self.rec_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_tracker, self.rec_tracker, self.kl_tracker]

    def call(self, x):
        h = self.hidden(ops.reshape(x, (-1, 28 * 28)))
        z_mean, z_log_var = self.mean(h), self.log_var(h)
        z = self.sampling([z_mean, z_log_var])
        return z_mean, z_log_var, ops.reshape(self.out(self.up(z)), (-1, 28, 28))

    def logs(self, total, rec, kl):
        self.total_tracker.update_state(total)
        self.rec_tracker.update_state(rec)
        self.kl_tracker.update_state(kl)
        return {  # keras-io's names: "loss", not the tracker's "total_loss"
            "loss": self.total_tracker.result(),
            "reconstruction_loss": self.rec_tracker.result(),
            "kl_loss": self.kl_tracker.result(),
        }

    if BACKEND == "tensorflow":

        def train_step(self, data):
            import tensorflow as tf

            x = data[0] if isinstance(data, tuple) else data
            with tf.GradientTape() as tape:
                total, rec, kl = losses(x, *self(x))
            grads = tape.gradient(total, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            return self.logs(total, rec, kl)

    else:

        def train_step(self, state, data):
            import jax

            trainable, non_trainable, optimizer, metrics = state
            x = data[0] if isinstance(data, tuple) else data

            def loss(trainable, non_trainable):
                outputs, non_trainable = self.stateless_call(trainable, non_trainable, x)
                total, rec, kl = losses(x, *outputs)
                return total, (rec, kl, non_trainable)

            (total, (rec, kl, non_trainable)), grads = jax.value_and_grad(loss, has_aux=True)(
                trainable, non_trainable
            )
            trainable, optimizer = self.optimizer.stateless_apply(optimizer, grads, trainable)
            mapping = list(zip(self.metrics_variables, metrics))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                logs = self.logs(total, rec, kl)
            metrics = [scope.get_current_value(v) for v in self.metrics_variables]
            return logs, (trainable, non_trainable, optimizer, metrics)


data = mirrorfit.load_mnist(train_examples=1024, download=False)
x = (data.x_train / 255.0).astype("float32")
keras.utils.set_random_seed(1)
vae = VAE()
vae.compile(optimizer=keras.optimizers.Adam(1e-3))
fit = mirrorfit.fit if MODE == "mirrorfit" else type(vae).fit
history = fit(vae, x, batch_size=64, epochs=3, verbose=0, shuffle=False).history
with open(OUT, "w") as f:
    json.dump({"history": history}, f)
