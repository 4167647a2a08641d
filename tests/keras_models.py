"""Keras models and data as a user's --model / --data / --callbacks functions give them (the
CLI's compiled-model path, tests/job/test_keras_job.py)."""

import keras
import numpy as np


def regression():
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
    return model


def diverging():
    """The regression at a learning rate that overflows within a few steps."""
    model = regression()
    model.compile(optimizer=keras.optimizers.SGD(1e30), loss="mse")
    return model


def uncompiled():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])


def normalized(compiled=True):
    """The regression with BatchNormalization after its hidden layer (SGD, seeded)."""
    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16),
            keras.layers.BatchNormalization(momentum=0.5),
            keras.layers.ReLU(),
            keras.layers.Dense(1),
        ]
    )
    if compiled:
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def chapter_cnn():
    """Hands-On ML's way: uint8 pixels in, Rescaling(1/255) first."""
    model = keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Reshape((28, 28, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def digits(input_shape=(28, 28), num_classes=10):
    """A user's MNIST classifier, compiled with its own optimizer and loss."""
    model = keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(num_classes, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def digits_dropout(input_shape=(28, 28), num_classes=10):
    """The same with Dropout (its seed generator's state: uint32 on JAX, int64 on TensorFlow)."""
    model = keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(num_classes, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def digits_saturated(input_shape=(28, 28), num_classes=10):
    """Raw uint8 pixels into a softmax, no scaling: its outputs saturate, where a backend's
    crossentropy shows (clipped at 1e-7 on JAX, from the logits on TensorFlow)."""
    model = keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(num_classes, activation="softmax"),
        ]
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def digits_unbuilt():
    """A Sequential without an Input, built from the first batch, not compiled."""
    return keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(10, "softmax")])


def conv_unbuilt():
    """A Sequential of Conv2D without an Input, built from its first batch."""
    return keras.Sequential([keras.layers.Conv2D(4, 3), keras.layers.Flatten()])


class _OwnStep(keras.Sequential):
    """A Sequential whose train_step is its own (Keras's, called through super())."""

    def train_step(self, *args, **kwargs):
        return super().train_step(*args, **kwargs)


def digits_own_step():
    """``digits`` with a train_step of its own."""
    model = _OwnStep(
        [keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(10, "softmax")]
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def digits_for_the_data(input_shape, num_classes):
    """The same, with no defaults: mirrorfit builds it for the data's shape and classes."""
    return digits(input_shape, num_classes)


def regression_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    return (x[:400], y[:400]), (x[400:], y[400:])


class StopAfterOne(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True


def stop_after_one():
    return [StopAfterOne()]


def two_outputs():
    """Two outputs, two losses: MNIST's one label array cannot feed it."""
    inputs = keras.Input((28, 28))
    flat = keras.layers.Flatten()(inputs)
    model = keras.Model(
        inputs,
        [keras.layers.Dense(10, activation="softmax")(flat), keras.layers.Dense(1)(flat)],
    )
    model.compile("adam", ["sparse_categorical_crossentropy", "mse"])
    return model


def for_32x32():
    model = keras.Sequential(
        [keras.Input((32, 32)), keras.layers.Flatten(), keras.layers.Dense(10, "softmax")]
    )
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def mse_on_labels():
    """MSE against a 10-way output, fed MNIST's integer labels."""
    model = keras.Sequential(
        [keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(10, "softmax")]
    )
    model.compile("adam", "mse")
    return model


class _KilledInEpochTwo(keras.callbacks.Callback):
    """SIGKILL once the call ending at step 15 of the second epoch is done: no checkpoint of
    the signal's, only those written before. A split state's checkpoints commit in the
    background: the kill waits (up to 60 s) for the one at step 10 of that epoch to be in
    place in the run's --checkpoint-dir, as a kill landing later would find it."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch >= 14:
            import os
            import signal
            import sys
            import time
            from pathlib import Path

            folder = Path(sys.argv[sys.argv.index("--checkpoint-dir") + 1])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if (folder / "epoch-000001-step-000010" / "meta.json").is_file():
                    break
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)


def killed_in_epoch_two():
    return [_KilledInEpochTwo()]


def rgb_32x32():
    """A classifier of 32x32 RGB images, compiled."""
    return digits((32, 32, 3), 10)


def two_image_inputs():
    """Two image inputs, concatenated: one image per example cannot feed it."""
    a, b = keras.Input((28, 28, 1)), keras.Input((28, 28, 1))
    flat = keras.layers.Flatten()(keras.layers.Concatenate()([a, b]))
    model = keras.Model([a, b], keras.layers.Dense(10, activation="softmax")(flat))
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def resnet50(input_shape=(224, 224, 3), num_classes=1000):
    """keras.applications' ResNet50 (random weights) as a user compiles it: SGD with momentum,
    sparse categorical crossentropy, accuracy (benchmarks/gpu_check.sh: through
    mirrorfit.fit in bf16)."""
    model = keras.applications.ResNet50(
        weights=None, input_shape=tuple(input_shape), classes=num_classes
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def compiled_mlp(input_shape=(28, 28), num_classes=10):
    """mirrorfit's own MLP, compiled in a user's function (as a Keras script uses it)."""
    from mirrorfit.models import mlp

    model = mlp(input_shape, num_classes)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def compiled_without_input(num_classes=10):
    """A compiled Sequential that declares no keras.Input (built on its first batch)."""
    model = keras.Sequential(
        [keras.layers.Flatten(), keras.layers.Dense(num_classes, activation="softmax")]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
