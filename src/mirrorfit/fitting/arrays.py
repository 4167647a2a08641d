"""Blocks straight from NumPy arrays: one gather per array for a block of S global batches,
instead of S slices, pads and stacks (what Keras's array adapter and
:mod:`mirrorfit.fitting.blocks` would do, in the same order and with the same padding)."""

from __future__ import annotations

import numpy as np

from mirrorfit.fitting.blocks import BLOCK_BYTES, Block


def arrays_of(source) -> tuple | None:
    """The ``(x, y, sample_weight)`` NumPy structures of a Keras array adapter (class weights
    folded in), or None where this path does not apply (other sources, ``shuffle="batch"``,
    arrays of other libraries)."""
    from keras import tree
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
    from keras.src.trainers.data_adapters.data_adapter_utils import unpack_x_y_sample_weight

    if type(source) is not ArrayDataAdapter or source._shuffle == "batch":
        return None
    inputs = source._inputs
    if not all(isinstance(a, np.ndarray) for a in tree.flatten(inputs) if a is not None):
        return None
    return unpack_x_y_sample_weight(inputs)


def array_blocks(
    source,
    arrays: tuple,
    batch_size: int,
    size: int,
    *,
    drop_remainder: bool = False,
    skip: int = 0,
    zeros: bool = False,
):
    """One epoch of blocks of up to ``size`` padded global batches (see
    :func:`mirrorfit.fitting.batches.padded`), in Keras's order: a fresh permutation each
    epoch where the adapter shuffles (``np.random``, as Keras draws it); from batch ``skip``
    on (the permutation is drawn whole all the same); ``zeros`` as ``padded``'s."""
    import keras
    from keras import tree

    from mirrorfit.fitting.batches import ones_like_targets

    x, y, w = arrays
    n = source._num_samples
    order = np.random.permutation(n) if source._shuffle else np.arange(n)
    batches = n // batch_size if drop_remainder else -(-n // batch_size)
    floatx = keras.config.floatx()
    row_bytes = sum(a[:1].nbytes for a in tree.flatten((x, y, w)) if a is not None)
    size = max(1, min(size, BLOCK_BYTES // max(1, row_bytes * batch_size)))
    for first in range(skip, batches, size):
        steps = min(size, batches - first)
        start, stop = first * batch_size, min(n, (first + steps) * batch_size)
        index = np.zeros(size * batch_size, np.int64)
        index[: stop - start] = order[start:stop]
        real = stop - start
        index[real:] = order[stop - 1]  # padding: the last example, as batches.padded's

        def gather(a, index=index, real=real, zeros=zeros):
            out = a[index]
            if zeros:
                out[real:] = 0
            return out.reshape((size, batch_size) + a.shape[1:])

        def weights(a, index=index, real=real):
            out = a[index].astype(floatx, copy=False)
            out[real:] = 0  # padding weighs nothing
            return out.reshape((size, batch_size) + a.shape[1:])

        mask = np.zeros(size * batch_size, floatx)
        mask[:real] = 1
        counts = np.clip(real - np.arange(size) * batch_size, 1, batch_size)
        data = {
            "x": tree.map_structure(gather, x),
            # floatx, as batches.padded casts them (NumPy's np.ones is float64; ints too)
            "w": tree.map_structure(
                weights, w if w is not None else ones_like_targets(y, n, floatx)
            ),
            "mask": mask.reshape(size, batch_size),
            "scale": np.repeat((batch_size / counts).astype(floatx)[:, None], batch_size, axis=1),
        }
        if y is not None:
            data["y"] = tree.map_structure(gather, y)
        yield Block(data=data, steps=steps)
