"""Models for tests that load ``--model package.module:function`` (tests/ is on PYTHONPATH)."""

import keras


def tiny():
    return keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="tiny",
    )


def tiny_dropout():
    """The smallest model with Dropout: its RNG state must survive a checkpoint."""
    return keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="tiny_dropout",
    )


def exiting():
    raise SystemExit(0)


def raising():
    raise ValueError("no such layer size")


def not_a_model():
    return 42


class _PythonCall(keras.layers.Layer):
    """Passes its input through a Python function (tf.numpy_function: XLA cannot compile it)."""

    def call(self, x):
        import tensorflow as tf

        out = tf.numpy_function(lambda a: a, [x], x.dtype)
        out.set_shape(x.shape)
        return out


def not_xla_compilable():
    return keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Flatten(),
            _PythonCall(),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="unique",
    )


def sized(input_shape=(28, 28), num_classes=10):
    """A user model that takes the data's shape and classes (model_factory passes them)."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(num_classes, activation="softmax"),
        ],
        name="sized",
    )
