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


def compiled_adam():
    """A model compiled as Keras users do (Adam, its own loss, Dropout), its pixels scaled in
    the model: trained as compiled on MNIST's uint8 arrays."""
    model = keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="compiled_adam",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def compiled_iou(metrics: bool = True):
    """:func:`compiled_adam` without Dropout, with MeanIoU (a metric that assigns its state:
    v.assign(v + x))."""
    model = keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="compiled_iou",
    )
    iou = keras.metrics.MeanIoU(num_classes=10, sparse_y_pred=False)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy", *([iou] if metrics else [])],
    )
    return model


def compiled_batchnorm():
    """:func:`compiled_iou` with BatchNormalization after its hidden layer, accuracy alone."""
    model = keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(32),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="compiled_batchnorm",
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class _MeanConfidence(keras.metrics.Mean):
    """A metric of the user's own: a Mean whose update_state is its own, adding only."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        return super().update_state(keras.ops.max(y_pred, axis=-1), sample_weight)


def compiled_counted():
    """:func:`compiled_iou` with metrics of increments: accuracy and a Mean of its own."""
    model = compiled_iou(metrics=False)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy", _MeanConfidence(name="confidence")],
    )
    return model


def compiled_jit():
    """:func:`compiled_counted`, compiled with jit_compile=True."""
    model = compiled_iou(metrics=False)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", jit_compile=True)
    return model


def two_targets():
    """--data: 28x28 inputs and a target per output of :func:`compiled_two_outputs`, 250
    training rows (a partial last batch at 64) and 50 for validation."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((300, 28, 28)).astype("float32")
    y = rng.integers(0, 10, 300)
    targets = {"a": y, "b": (y + 1) % 10}
    train = (x[:250], {k: v[:250] for k, v in targets.items()})
    return train, (x[250:], {k: v[250:] for k, v in targets.items()})


def compiled_two_outputs():
    """Two outputs, a loss each: per-output loss means in the logs."""
    inputs = keras.Input((28, 28))
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(inputs))
    model = keras.Model(
        inputs,
        {
            "a": keras.layers.Dense(10, activation="softmax", name="a")(hidden),
            "b": keras.layers.Dense(10, activation="softmax", name="b")(hidden),
        },
    )
    model.compile(
        optimizer="sgd",
        loss={"a": "sparse_categorical_crossentropy", "b": "sparse_categorical_crossentropy"},
    )
    return model


class _TerminateOnce(keras.callbacks.Callback):
    """SIGTERM to this process after the call that reaches batch 5 of epoch 2, once: where the file
    ``$MIRRORFIT_TEST_STOP_MARK`` does not exist yet (it is made on sending)."""

    def __init__(self):
        super().__init__()
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        import os
        import signal
        from pathlib import Path

        mark = Path(os.environ["MIRRORFIT_TEST_STOP_MARK"])
        if self.epoch == 1 and batch + 1 >= 5 and not mark.exists():
            mark.write_text("sent")
            os.kill(os.getpid(), signal.SIGTERM)


def terminate_once():
    """--callbacks: :class:`_TerminateOnce`."""
    return [_TerminateOnce()]


class _OwnStep(keras.Sequential):
    """A model with its own train_step (keras.io's 'Customizing what happens in fit()')."""

    def train_step(self, data):
        return super().train_step(data)


def own_train_step():
    model = _OwnStep(
        [keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(10)], name="own"
    )
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
    return model


class _OwnLoss(keras.Sequential):
    """A model with its own compute_loss (keras.io's pattern: the compiled loss, plus an L2
    penalty on the first kernel), trained by Keras's own train_step."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        return loss + 1e-4 * keras.ops.sum(keras.ops.square(self.layers[2].kernel))


def own_compute_loss():
    model = _OwnLoss(
        [
            keras.Input((28, 28)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="own_loss",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


@keras.saving.register_keras_serializable(package="user_models")
class _Subclassed(keras.Model):
    """A subclassed classifier with no keras.Input: built on the data it first sees."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.flatten = keras.layers.Flatten()
        self.dense = keras.layers.Dense(10, activation="softmax")

    def call(self, x):
        return self.dense(self.flatten(x))


def subclassed():
    return _Subclassed(name="subclassed")


def logits():
    """An uncompiled classifier that ends in logits (no softmax)."""
    return keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(10)])


def two_inputs():
    """An uncompiled classifier of two images."""
    a, b = keras.Input((28, 28)), keras.Input((28, 28))
    joined = keras.layers.Concatenate()([keras.layers.Flatten()(a), keras.layers.Flatten()(b)])
    return keras.Model([a, b], keras.layers.Dense(10, activation="softmax")(joined))


class _KeywordCall(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(10, activation="softmax")

    def call(self, *, images):
        return self.dense(keras.ops.reshape(images, (-1, 784)))


def keyword_call():
    """A subclassed model whose call takes its images by keyword only."""
    return _KeywordCall()


def own_rescaling():
    """An uncompiled classifier that scales its pixels itself."""
    return keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
