"""Synchronized BatchNormalization (``mirrorfit.setup(sync_batchnorm=True)``, ``--sync-batchnorm``):
each BatchNormalization layer's batch mean and variance over every replica's share of the
global batch, on every worker, as one device computes them over the whole batch (padding rows
of a partial last batch left out). Units: the moments are per channel, as Keras's.
(why: docs/keras-script.md#what-is-not-one-devices)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

# While a per-replica step traces: (all_sum, rows). ``all_sum(list)`` sums each tensor over
# every replica (the engine's collective); ``rows``: 1 per real example of this replica's
# share, 0 per padding row, or None.
_across: contextvars.ContextVar = contextvars.ContextVar("mirrorfit_sync_bn", default=None)


def layers(model) -> list:
    """The model's BatchNormalization layers, nested ones included."""
    import keras

    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


def per_replica(model) -> list:
    """The BatchNormalization layers that compute their moments per replica: trainable (a
    frozen one normalises with its moving statistics), not synchronized by
    :func:`synchronize`, nor by Keras (``synchronized=True``, TensorFlow)."""
    return [
        layer
        for layer in layers(model)
        if layer.trainable
        and not getattr(layer, "synchronized", False)
        and "_moments" not in vars(layer)
    ]


def synchronize(model) -> int:
    """Every BatchNormalization layer of ``model`` computes its moments over every replica
    while a step runs inside :func:`across` (Keras's own computation elsewhere: its own
    ``evaluate``, ``fit``). Returns the number of layers."""
    found = layers(model)
    for layer in found:
        if "_moments" not in vars(layer):  # past Keras's attribute tracking: not state
            object.__setattr__(layer, "_moments", functools.partial(_moments, layer))
    return len(found)


@contextlib.contextmanager
def across(all_sum, rows=None):
    """Around the tracing of one replica's forward pass: synchronized layers reduce with
    ``all_sum``, counting the rows where ``rows`` is 1."""
    token = _across.set((all_sum, rows))
    try:
        yield
    finally:
        _across.reset(token)


def _moments(layer, inputs, mask):
    """(mean, variance) per channel over the real rows of every replica: two passes, the
    variance about the global mean, as one device's ``ops.moments``."""
    from keras import ops

    reducing = _across.get()
    if reducing is None:
        return type(layer)._moments(layer, inputs, mask)
    all_sum, rows = reducing
    axes = layer._reduction_axes
    # 1 per row counted, the channel axis 1 wide: the count is the same for every channel
    weights = ops.ones_like(ops.take(inputs, [0], axis=layer.axis))
    if rows is not None and inputs.shape[0] == rows.shape[0]:
        weights = weights * ops.reshape(
            ops.cast(rows, inputs.dtype), (-1,) + (1,) * (len(inputs.shape) - 1)
        )
    elif rows is not None:  # a reshaped batch axis: which row is padding is not known
        import warnings

        warnings.warn(
            f"BatchNormalization {layer.name!r} takes {inputs.shape[0]} rows per replica where "
            f"its share of the batch has {rows.shape[0]} (a reshaped batch axis): its "
            "synchronized statistics count the padding of a partial last batch; pass "
            "drop_remainder=True, or a batch size that divides the data",
            stacklevel=2,
        )
    if mask is not None:  # Keras's mask: one per position, channels last (as Keras's own)
        weights = weights * ops.expand_dims(ops.cast(mask, inputs.dtype), -1)
    count, total = all_sum(
        [ops.sum(weights, axes, keepdims=True), ops.sum(inputs * weights, axes, keepdims=True)]
    )
    count = ops.maximum(count, 1e-12)  # no real row anywhere: moments 0, not NaN
    mean = total / count
    (squares,) = all_sum([ops.sum(ops.square(inputs - mean) * weights, axes, keepdims=True)])
    return ops.squeeze(mean, axes), ops.squeeze(squares / count, axes)
