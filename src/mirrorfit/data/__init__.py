"""Data: locating and loading data sets (``mnist``, ``sources``), and the tf.data pipelines
(``pipeline``, ``images``, ``records``).

Names load on first use (PEP 562): :mod:`mirrorfit.data.spec` is imported by the configuration
before TensorFlow loads, and importing this package must not import TensorFlow.
"""

import importlib

_EXPORTS = {
    "Splits": "mirrorfit.data.mnist",
    "load_mnist": "mirrorfit.data.mnist",
    "locate_mnist": "mirrorfit.data.mnist",
    "eval_dataset": "mirrorfit.data.pipeline",
    "train_batches": "mirrorfit.data.pipeline",
    "Data": "mirrorfit.data.sources",
    "load_data": "mirrorfit.data.sources",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mirrorfit.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
