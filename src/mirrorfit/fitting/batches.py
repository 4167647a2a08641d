"""What ``mirrorfit.fit`` reads: anything Keras's ``fit`` takes (arrays, dicts and lists of
them, ``tf.data.Dataset``, generators, ``keras.utils.PyDataset``), through Keras's own data
adapters, as global batches of one static size.

Every batch becomes a dict: ``x``, ``y`` (absent when the data has none), ``w`` (the sample
weights, ``class_weight`` folded in, ones where none were given; nested like ``y`` where Keras
nests them), ``mask`` (1 for a real example, 0 for padding) and ``scale`` (global batch / real
examples, the same for every row). A partial batch is padded with zeros to the global batch, so
the replicas keep static shapes; the loss multiplies ``w`` by ``scale`` and the metrics by
``mask``, so the update and the metrics are those of the real examples only (Keras's own way
with masked losses). Inputs and targets keep their dtypes.
"""

from __future__ import annotations

import numpy as np

from mirrorfit.errors import FitError

KEYS = ("x", "y", "w", "mask", "scale")


def adapter(x, y=None, *, sample_weight=None, class_weight=None, batch_size=None,
            steps_per_epoch=None, shuffle=False):
    """Keras's data adapter for what ``fit`` was given (its own checks and messages)."""
    from keras.src.trainers.data_adapters import get_data_adapter

    return get_data_adapter(x=x, y=y, sample_weight=sample_weight, batch_size=batch_size,
                            steps_per_epoch=steps_per_epoch, shuffle=shuffle,
                            class_weight=class_weight)


def check_batch_size(batch_size: int, replicas: int, accum_steps: int = 1) -> None:
    """ValueError unless the global batch splits evenly into replicas x micro-batches."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise FitError(f"batch_size={batch_size!r}: give the global batch, a whole number "
                          "of at least 1")
    if batch_size % (replicas * accum_steps):
        raise FitError(
            f"batch_size={batch_size} does not split over {replicas} replica(s) x "
            f"{accum_steps} micro-batch(es); use a multiple of {replicas * accum_steps}, e.g. "
            f"{replicas * accum_steps * max(1, round(batch_size / (replicas * accum_steps)))}")


def padded(data, batch_size: int, *, where: str = "training data") -> dict | None:
    """One batch of ``(x, y, sample_weight)`` NumPy structures as the dict above, padded to
    ``batch_size`` rows; None for a batch of 0 examples."""
    import keras
    from keras import tree

    x, y, w = _unpacked(data)
    n = rows(data, where=where)
    if n == 0:
        return None
    if n > batch_size:
        raise FitError(f"a batch of the {where} holds {n} examples, more than batch_size="
                          f"{batch_size}; batch it to at most {batch_size} (or pass that "
                          "batch_size)")
    for a in tree.flatten((x, y, w)):
        if a is not None and np.asarray(a).dtype == object:
            raise FitError(f"the {where} holds an array of Python objects (dtype object); "
                              "give numeric arrays")
    floatx = keras.config.floatx()
    if w is None:
        w = _ones_like_targets(y, n, floatx)
    w = tree.map_structure(lambda a: np.asarray(a, floatx), w)
    out = {"x": tree.map_structure(lambda a: _pad(a, batch_size), x),
           "w": tree.map_structure(lambda a: _pad(a, batch_size), w),
           "mask": _pad(np.ones((n,), floatx), batch_size),
           "scale": np.full((batch_size,), batch_size / n, floatx)}
    if y is not None:
        out["y"] = tree.map_structure(lambda a: _pad(a, batch_size), y)
    return out


def _unpacked(data):
    from keras.src.trainers.data_adapters.data_adapter_utils import unpack_x_y_sample_weight

    return unpack_x_y_sample_weight(tuple(data) if isinstance(data, list) else data)


def rows(data, *, where: str = "training data") -> int:
    """The examples in one batch of ``(x, y, sample_weight)``; FitError when its arrays
    disagree."""
    from keras import tree

    leaves = [a for a in tree.flatten(_unpacked(data)) if a is not None]
    sizes = {np.shape(a)[0] if np.ndim(a) else None for a in leaves}
    if len(sizes) != 1 or None in sizes:
        raise FitError(f"a batch of the {where} has arrays of different lengths "
                          f"({sorted(map(str, sizes))}); every input, target and weight needs "
                          "one row per example")
    return sizes.pop()


def _ones_like_targets(y, n: int, dtype):
    """Weights of 1, one per target: shaped ``(n, 1, ...)`` to the target's rank, so that they
    broadcast against a per-example loss and a per-token one alike (a ``(n,)`` weight
    against an ``(n, T)`` loss is Keras's own broadcasting error)."""
    from keras import tree

    if y is None:
        return np.ones((n,), dtype)
    return tree.map_structure(
        lambda a: np.ones((n,) + (1,) * max(0, np.ndim(a) - 1), dtype), y)


def _pad(a, rows: int) -> np.ndarray:
    a = np.asarray(a)
    if a.shape[0] == rows:
        return a
    return np.concatenate([a, np.zeros((rows - a.shape[0], *a.shape[1:]), a.dtype)])


def real_examples(batch: dict) -> int:
    """How many rows of a padded batch are real."""
    return int(round(batch["mask"].shape[0] / float(batch["scale"][0])))


def signature(batch: dict) -> tuple:
    """Shapes and dtypes of a padded batch: batches of one signature stack into a block."""
    from keras import tree

    return tuple((np.shape(a), np.asarray(a).dtype.str) for a in tree.flatten(batch))
