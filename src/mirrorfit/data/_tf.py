"""TensorFlow, imported on first use: the data modules that build tf.data pipelines are also
what the JAX engine reads MNIST, ``.npz`` files, a function's arrays and synthetic data
through, with NumPy alone, on a machine that may have no TensorFlow. ``tf.data.Dataset`` in an
annotation costs nothing (annotations are not evaluated)."""

from __future__ import annotations

import importlib


class _TensorFlow:
    def __getattr__(self, name: str):
        from mirrorfit._frameworks import tensorflow_start_filtered

        with tensorflow_start_filtered():  # its start-up lines, as the TF engine's
            module = importlib.import_module("tensorflow")
        return getattr(module, name)


tf = _TensorFlow()

__all__ = ["tf", "is_dataset"]


def is_dataset(value) -> bool:
    """Whether ``value`` is a tf.data.Dataset, without importing TensorFlow (a dataset cannot
    exist before it is imported)."""
    import sys

    module = sys.modules.get("tensorflow")
    return module is not None and isinstance(value, module.data.Dataset)
