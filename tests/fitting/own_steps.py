"""keras-io's VAE (its own train_step, three trackers whose logs it renames, a SeedGenerator
drawing in a Sampling layer) and GAN (no call(), two optimizers, a Keras loss inside the step),
in each backend's form (the JAX GAN carries its two optimizers as JAX GANs do for Keras's own
fit), trained on 1,024 MNIST images by ``mirrorfit.fit`` on 2 replicas (``mirrorfit``), by its
own ``fit`` on one device (``keras``) or by its own ``fit`` on the same 2 replicas
(``keras-2``: MirroredStrategy on TensorFlow, ``DataParallel`` on JAX; benchmarks/own_step.py
times it against ``mirrorfit``). Run as ``python own_steps.py BACKEND MODE OUT [EXAMPLES
EPOCHS]`` in a fresh process; writes OUT (JSON: the histories, and each model's steady
examples/s, every epoch but the first)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings

import mirrorfit

BACKEND, MODE, OUT = sys.argv[1:4]
EXAMPLES, EPOCHS = (int(a) for a in sys.argv[4:6]) if len(sys.argv) > 4 else (1024, 3)
if MODE == "mirrorfit" or (MODE == "keras-2" and BACKEND == "tensorflow"):
    mirrorfit.setup(backend=BACKEND, replicas=2)  # keras-2: Keras's fit under its strategy
else:
    os.environ["KERAS_BACKEND"] = BACKEND
    if MODE == "keras-2":
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import keras  # noqa: E402
from keras import layers, ops  # noqa: E402

if MODE == "keras-2" and BACKEND == "jax":
    keras.distribution.set_distribution(keras.distribution.DataParallel())


class Clock(keras.callbacks.Callback):
    """Steady examples/s: every epoch but the first (which compiles)."""

    def on_train_begin(self, logs=None):
        self.times = []

    def on_epoch_begin(self, epoch, logs=None):
        import time

        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        import time

        self.times.append(time.perf_counter() - self.start)

    def rate(self) -> float | None:
        return EXAMPLES * (len(self.times) - 1) / sum(self.times[1:]) if self.times[1:] else None


def trained(model, x) -> dict:
    """The model's history and steady examples/s, fit as MODE says."""
    clock = Clock()
    fit = mirrorfit.fit if MODE == "mirrorfit" else type(model).fit
    kwargs = dict(batch_size=64, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[clock])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = fit(model, x, **kwargs).history
    said = [str(w.message) for w in caught if "runs per replica" in str(w.message)]
    return {"history": history, "examples_per_sec": clock.rate(), "per_replica": said}


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


data = mirrorfit.load_mnist(train_examples=EXAMPLES, download=False)
x = (data.x_train / 255.0).astype("float32")
keras.utils.set_random_seed(1)
vae = VAE()
vae.compile(optimizer=keras.optimizers.Adam(1e-3))
results = {"vae": trained(vae, x)}


class GAN(keras.Model):  # keras-io's "Customizing what happens in fit()" GAN, no call()
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator, self.generator = discriminator, generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    def logs(self, d_loss, g_loss):
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    if BACKEND == "tensorflow":

        def train_step(self, real_images):
            import tensorflow as tf

            n = ops.shape(real_images)[0]
            z = keras.random.normal((n, self.latent_dim), seed=self.seed_generator)
            images = ops.concatenate([self.generator(z), real_images], axis=0)
            labels = ops.concatenate([ops.ones((n, 1)), ops.zeros((n, 1))], axis=0)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(images))
            d_weights = self.discriminator.trainable_weights
            self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, d_weights), d_weights))
            z = keras.random.normal((n, self.latent_dim), seed=self.seed_generator)
            with tf.GradientTape() as tape:
                g_loss = self.loss_fn(ops.zeros((n, 1)), self.discriminator(self.generator(z)))
            g_weights = self.generator.trainable_weights
            self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, g_weights), g_weights))
            return self.logs(d_loss, g_loss)

    else:  # the same step, stateless; the two optimizers' variables ride in Keras's state
        # slot for the optimizer, as JAX GANs written for Keras's own fit carry them (they
        # override Keras's _get_jax_state and jax_state_sync, which Keras's fit calls)

        def _get_jax_state(self, *args, **kwargs):
            with self.both_optimizers():
                return super()._get_jax_state(*args, **kwargs)

        def jax_state_sync(self):
            with self.both_optimizers():
                super().jax_state_sync()

        def _get_state_sharding_spec(self):  # under keras.distribution (DataParallel)
            with self.both_optimizers():
                return super()._get_state_sharding_spec()

        @contextlib.contextmanager
        def both_optimizers(self):
            """Keras's state helpers read ``self.optimizer.variables``: both optimizers'."""
            kept = self.optimizer
            self.optimizer = Both(self.d_optimizer, self.g_optimizer)
            try:
                yield
            finally:
                self.optimizer = kept

        def train_step(self, state, real_images):
            import jax

            trainable, non_trainable, optimizer, metrics = state
            d_part, g_part = self.parts(trainable)
            d_opt = optimizer[: len(self.d_optimizer.variables)]
            g_opt = optimizer[len(self.d_optimizer.variables) :]
            n = real_images.shape[0]
            mapping = list(zip(self.non_trainable_variables, non_trainable))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                z1 = keras.random.normal((n, self.latent_dim), seed=self.seed_generator)
                z2 = keras.random.normal((n, self.latent_dim), seed=self.seed_generator)
            non_trainable = [scope.get_current_value(v) for v in self.non_trainable_variables]
            fake, _ = self.generator.stateless_call(g_part, [], z1)
            images = ops.concatenate([fake, real_images], axis=0)
            labels = ops.concatenate([ops.ones((n, 1)), ops.zeros((n, 1))], axis=0)

            def d_loss_of(d_part):
                return self.loss_fn(
                    labels, self.discriminator.stateless_call(d_part, [], images)[0]
                )

            def g_loss_of(g_part):
                fake, _ = self.generator.stateless_call(g_part, [], z2)
                judged, _ = self.discriminator.stateless_call(d_part, [], fake)
                return self.loss_fn(ops.zeros((n, 1)), judged)

            d_loss, d_grads = jax.value_and_grad(d_loss_of)(d_part)
            d_part, d_opt = self.d_optimizer.stateless_apply(d_opt, d_grads, d_part)
            g_loss, g_grads = jax.value_and_grad(g_loss_of)(g_part)
            g_part, g_opt = self.g_optimizer.stateless_apply(g_opt, g_grads, g_part)
            mapping = list(zip(self.metrics_variables, metrics))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                logs = self.logs(d_loss, g_loss)
            metrics = [scope.get_current_value(v) for v in self.metrics_variables]
            state = (list(d_part) + list(g_part), non_trainable, list(d_opt) + list(g_opt), metrics)
            return logs, state

        def parts(self, trainable):
            """The discriminator's and the generator's shares of the model's trainable values
            (the discriminator's variables come first: it was set first)."""
            d = len(self.discriminator.trainable_variables)
            return trainable[:d], trainable[d:]


class Both:
    """Two optimizers seen as one by Keras's state helpers: their variables, in order."""

    def __init__(self, first, second):
        self.variables = [*first.variables, *second.variables]


keras.utils.set_random_seed(1)
discriminator = keras.Sequential(
    [
        keras.Input((28, 28)),
        layers.Flatten(),
        layers.Dense(32, activation="relu"),
        layers.Dense(1),
    ]
)
generator = keras.Sequential(
    [keras.Input((8,)), layers.Dense(32, activation="relu"), layers.Dense(28 * 28)]
    + [layers.Reshape((28, 28))]
)
gan = GAN(discriminator, generator, 8)
gan.compile(
    keras.optimizers.Adam(1e-3),
    keras.optimizers.Adam(1e-3),
    keras.losses.BinaryCrossentropy(from_logits=True),
)
if BACKEND == "jax":
    gan.d_optimizer.build(discriminator.trainable_variables)
    gan.g_optimizer.build(generator.trainable_variables)
    gan.built = True  # its optimizers built: Keras's fit would build it, which needs a call()
elif MODE == "keras-2":  # Keras's fit under a strategy builds it first, which needs a call()
    gan.built = True  # what its message asks: "build it yourself"
results["gan"] = trained(gan, x)
if BACKEND == "jax" and MODE == "mirrorfit":  # the same GAN without the state hooks

    class Hookless(GAN):
        _get_jax_state = keras.Model._get_jax_state
        jax_state_sync = keras.Model.jax_state_sync

    hookless = Hookless(discriminator, generator, 8)
    hookless.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3), gan.loss_fn)
    hookless.built = True
    try:
        mirrorfit.fit(hookless, x, epochs=1, batch_size=64, verbose=0)
        results["hookless"] = None
    except ValueError as e:
        results["hookless"] = str(e)
with open(OUT, "w") as f:
    json.dump(results, f)
