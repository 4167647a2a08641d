"""The chapter's reference models, and loading a user's model from ``package.module:function``.

Builders return uncompiled Keras models; the caller builds them under ``strategy.scope()`` so
their variables are mirrored.
"""

from __future__ import annotations

import importlib
from typing import Callable

import keras

from mirrorfit.errors import ConfigError

MNIST_SHAPE = (28, 28)


def mlp(input_shape: tuple[int, ...] = MNIST_SHAPE, num_classes: int = 10) -> keras.Model:
    """Flatten -> Dense(100, relu) -> Dense(10, softmax), as in chapter 19."""
    return keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Flatten(),
        keras.layers.Dense(100, activation="relu"),
        # float32 output under mixed precision too: a softmax in bf16/fp16 loses the small
        # probabilities the loss needs.
        keras.layers.Dense(num_classes, activation="softmax", dtype="float32"),
    ], name="mlp")


def cnn(input_shape: tuple[int, ...] = MNIST_SHAPE, num_classes: int = 10) -> keras.Model:
    """The chapter's CNN: Conv(64,7) -> Pool -> Conv(128,3) x2 -> Pool -> Dense(64) -> Dropout."""
    return keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Reshape(input_shape + (1,)),
        keras.layers.Conv2D(64, 7, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(num_classes, activation="softmax", dtype="float32"),
    ], name="cnn")


# config.MODELS holds the same names, to check --model before Keras loads (tests/test_models.py)
REFERENCE_MODELS: dict[str, Callable[..., keras.Model]] = {"mlp": mlp, "cnn": cnn}


def model_factory(spec: str) -> Callable[[], keras.Model]:
    """A zero-argument function building the model named by ``spec``.

    ``spec`` is ``mlp``, ``cnn`` or ``package.module:function`` (the function takes no
    arguments and returns a Keras model). Import problems are reported as ConfigError.
    """
    if spec in REFERENCE_MODELS:
        return REFERENCE_MODELS[spec]
    if ":" not in spec:
        raise ConfigError(f"unknown model {spec!r}; use mlp, cnn or package.module:function")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"cannot import module {module_name!r} for --model {spec!r} ({e}); "
                          "is it on PYTHONPATH?") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"module {module_name!r} has no function {attr!r} for --model {spec!r}")

    def build() -> keras.Model:
        model = fn()
        if not isinstance(model, keras.Model):
            raise ConfigError(f"--model {spec!r} returned {type(model).__name__}, "
                              "not a keras.Model")
        return model

    return build
