"""Models for tests that load ``--model package.module:function`` (tests/ is on PYTHONPATH)."""

import keras


def tiny():
    return keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(),
                             keras.layers.Dense(10, activation="softmax")], name="tiny")


def not_a_model():
    return 42
